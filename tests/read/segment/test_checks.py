"""The rules the read handle and ``verify`` share (``read.segment.checks``, ``codecs.blocks.first_non_padding``):
each returns what disagrees, so one caller can raise and the other collect."""

from __future__ import annotations

from streamoffload.codecs.blocks import first_non_padding, padding
from streamoffload.codecs.proto.offload_manifest_pb2 import SegmentManifest
from streamoffload.read.segment import ManifestDisagreement, manifest_disagreements, unsupported_format_version
from streamoffload.storage.base import ObjectInfo


def sealed(**fields: int) -> SegmentManifest:
    return SegmentManifest(
        formatVersion=2,
        startLedgerId=7,
        startEntryId=0,
        endLedgerId=9,
        endEntryId=41,
        dataKey="d",
        indexKey="i",
        **fields,
    )


def test_a_manifest_that_agrees_has_no_disagreements_and_unknown_facts_are_not_compared() -> None:
    manifest = sealed(dataLength=1000, indexLength=80, entries=50, entryBytes=900, blockCount=2)
    assert manifest_disagreements(manifest) == []
    agreeing = manifest_disagreements(
        manifest,
        format_version=2,
        data_length=1000,
        index_length=80,
        first=(7, 0),
        last=(9, 41),
        entries=50,
        entry_bytes=900,
        blocks=2,
    )
    assert agreeing == []


def test_every_disagreement_is_reported_in_order_with_what_was_said_and_found() -> None:
    manifest = sealed(dataLength=1000, indexLength=80, entries=50, entryBytes=900, blockCount=2)
    found = manifest_disagreements(
        manifest,
        format_version=1,
        data_length=999,
        index_length=81,
        first=(7, 1),
        last=(9, 40),
        entries=49,
        entry_bytes=901,
        blocks=3,
    )
    assert found == [
        ManifestDisagreement("formatVersion", 2, 1),
        ManifestDisagreement("dataLength", 1000, 999),
        ManifestDisagreement("indexLength", 80, 81),
        ManifestDisagreement("start", (7, 0), (7, 1)),
        ManifestDisagreement("end", (9, 41), (9, 40)),
        ManifestDisagreement("entries", 50, 49),
        ManifestDisagreement("entryBytes", 900, 901),
        ManifestDisagreement("blockCount", 2, 3),
    ]


def test_optional_manifest_fields_that_are_absent_are_not_compared() -> None:
    opened = SegmentManifest(formatVersion=2, startLedgerId=7, startEntryId=0, dataKey="d", indexKey="i")
    found = manifest_disagreements(opened, data_length=5, index_length=6, last=(9, 1), entries=3, blocks=1)
    assert found == []


def test_only_a_format_version_other_than_the_supported_one_is_unsupported() -> None:
    key = "s3managedledgeroffloaderformatversion"
    assert unsupported_format_version(ObjectInfo("k", 1, {})) is None
    assert unsupported_format_version(ObjectInfo("k", 1, {key: "1"})) is None
    assert unsupported_format_version(ObjectInfo("k", 1, {key: "2"})) == "2"


def test_first_non_padding_finds_the_first_byte_out_of_phase_past_one_compare_chunk() -> None:
    good = padding(200_000)
    assert first_non_padding(good, 0, len(good)) is None
    assert first_non_padding(b"xx" + good[:10], 2, 12) is None  # the pattern starts where padding starts
    broken = bytearray(good)
    broken[150_001] ^= 0xFF
    assert first_non_padding(bytes(broken), 0, len(broken)) == 150_001
    assert first_non_padding(bytes(broken), 0, 150_001) is None
