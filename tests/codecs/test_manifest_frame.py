"""Segment manifests are framed with a magic and a CRC-32C and decoded strictly: damage is an error naming
the object, never a different manifest (the issue: an empty or bit-flipped manifest parsed as Assigned)."""

from __future__ import annotations

import random
import uuid

import crc32c
import pytest

from streamoffload.checkpoints import manifest as mf
from streamoffload.codecs.errors import BadMagicError, ChecksumError, FormatError, TruncatedError
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest

KEY = "public/default/t/_meta/segments/x"


def sealed() -> SegmentManifest:
    opened = mf.new_manifest(
        topic="persistent://public/default/t-partition-0",
        segment_id=uuid.UUID(int=42),
        ordinal=3,
        format_version=2,
        start=(7, 10),
        assigned_ms=1_000,
        data_key="public/default/t-partition-0/" + str(uuid.UUID(int=42)),
        index_key="public/default/t-partition-0/" + str(uuid.UUID(int=42)) + "-index",
        driver_properties={mf.PROP_EPOCH: "1"},
    )
    spans = [mf.LedgerSpan(7, 10, 99, 90, 9_000)]
    return mf.sealed_manifest(
        opened,
        end=(7, 99),
        offloaded_ms=2_000,
        spans=spans,
        data_length=10_000,
        index_length=300,
        block_count=3,
        part_count=1,
        seal_reason="size",
    )


def frame(body: bytes) -> bytes:
    return mf.MANIFEST_MAGIC + crc32c.crc32c(body).to_bytes(4, "big") + body


def test_round_trip_and_layout() -> None:
    manifest = sealed()
    data = mf.encode_manifest(manifest)
    body = manifest.SerializeToString(deterministic=True)
    assert data == frame(body) and data[:4] == b"SOM\x01"
    assert mf.decode_manifest(data, where=KEY) == manifest
    assert mf.encode_manifest(manifest) == data  # deterministic: replays write the same bytes


@pytest.mark.parametrize(("data", "error"), [(b"", TruncatedError), (b"SOM\x01\x00", TruncatedError)])
def test_empty_and_short_objects_are_refused(data: bytes, error: type[FormatError]) -> None:
    with pytest.raises(error) as err:
        mf.decode_manifest(data, where=KEY)
    assert str(err.value).startswith(f"{KEY}: ")


def test_every_single_bit_flip_is_detected() -> None:
    data = mf.encode_manifest(sealed())
    for bit in range(len(data) * 8):
        damaged = bytearray(data)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(FormatError) as err:
            mf.decode_manifest(bytes(damaged), where=KEY)
        assert err.value.where == KEY
        assert isinstance(err.value, BadMagicError if bit < 32 else ChecksumError), bit
        assert err.value.offset == (0 if bit < 32 else 4)


def test_random_damage_is_detected() -> None:
    data = mf.encode_manifest(sealed())
    rnd = random.Random(5)
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rnd.randint(2, 8)):
            damaged[rnd.randrange(len(damaged))] = rnd.randrange(256)
        if bytes(damaged) == data:
            continue
        with pytest.raises(FormatError):
            mf.decode_manifest(bytes(damaged), where=KEY)
    with pytest.raises(FormatError):
        mf.decode_manifest(data[:-1], where=KEY)  # truncated: the CRC no longer matches


def test_unframed_manifests_are_refused() -> None:
    """Older, unframed manifests cannot be told from damage: refused, saying what may have happened."""
    with pytest.raises(BadMagicError, match="written before manifests carried a checksum"):
        mf.decode_manifest(sealed().SerializeToString(), where=KEY)


def test_a_valid_frame_around_an_incomplete_manifest_is_refused() -> None:
    incomplete = SegmentManifest(uidMsb=1, uidLsb=2, topic="t")  # no status, positions...
    with pytest.raises(FormatError, match=r"missing required fields: .*status") as err:
        mf.decode_manifest(frame(incomplete.SerializePartialToString(deterministic=True)), where=KEY)
    assert err.value.offset == mf.FRAME_LENGTH and err.value.where == KEY
    # The empty protobuf (the "empty manifest parses as Assigned") in a valid frame.
    with pytest.raises(FormatError, match="missing required fields"):
        mf.decode_manifest(frame(b""), where=KEY)


def test_an_unknown_status_is_refused() -> None:
    body = bytearray(sealed().SerializeToString(deterministic=True))
    at = body.index(bytes([0x20, mf.OFFLOADED]))  # field 4 (status), varint
    body[at + 1] = 9
    with pytest.raises(FormatError) as err:
        mf.decode_manifest(frame(bytes(body)), where=KEY)
    assert "status" in str(err.value) and err.value.where == KEY


def test_protobuf_garbage_in_a_valid_frame_is_refused() -> None:
    with pytest.raises(FormatError, match="not a segment manifest"):
        mf.decode_manifest(frame(b"\xff\xff\xff"), where=KEY)
