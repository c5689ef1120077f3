"""Pins the protobuf field numbers, wire types and labels of SPEC 3.6 and PulsarApi.proto.

Each field is serialised alone and its tag bytes are compared with ``(number << 3) | wire_type``,
so a renumbered field fails here even if the descriptor and the code using it agree with each other.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message as ProtoMessage

from streamoffload.codecs.proto import bookkeeper_pb2, managed_ledger_pb2, pulsar_api_pb2

ROOT = Path(__file__).resolve().parents[2]

VARINT, I64, LEN, I32 = 0, 1, 2, 5
REQ, OPT, REP = "required", "optional", "repeated"

LMF = bookkeeper_pb2.LedgerMetadataFormat
ML = managed_ledger_pb2
PA = pulsar_api_pb2

# message -> {field: (number, label, wire type)}; for the messages marked complete, no other field may exist.
EXPECTED: dict[type[ProtoMessage], dict[str, tuple[int, str, int]]] = {
    LMF: {
        "quorumSize": (1, REQ, VARINT),
        "ensembleSize": (2, REQ, VARINT),
        "length": (3, REQ, VARINT),
        "lastEntryId": (4, OPT, VARINT),
        "state": (5, REQ, VARINT),
        "segment": (6, REP, LEN),
        "digestType": (7, OPT, VARINT),
        "password": (8, OPT, LEN),
        "ackQuorumSize": (9, OPT, VARINT),
        "ctime": (10, OPT, VARINT),
        "customMetadata": (11, REP, LEN),
        "cToken": (12, OPT, VARINT),
    },
    LMF.Segment: {"ensembleMember": (1, REP, LEN), "firstEntryId": (2, REQ, VARINT)},
    LMF.cMetadataMapEntry: {"key": (1, OPT, LEN), "value": (2, OPT, LEN)},
    ML.KeyValue: {"key": (1, REQ, LEN), "value": (2, REQ, LEN)},
    ML.OffloadDriverMetadata: {"name": (1, REQ, LEN), "properties": (2, REP, LEN)},
    ML.OffloadContext: {
        "uidMsb": (1, OPT, VARINT),
        "uidLsb": (2, OPT, VARINT),
        "complete": (3, OPT, VARINT),
        "bookkeeperDeleted": (4, OPT, VARINT),
        "timestamp": (5, OPT, VARINT),
        "driverMetadata": (6, OPT, LEN),
        "offloadSegment": (7, REP, LEN),
    },
    ML.OffloadSegment: {
        "uidMsb": (1, OPT, VARINT),
        "uidLsb": (2, OPT, VARINT),
        "complete": (3, OPT, VARINT),
        "assignedTimestamp": (4, OPT, VARINT),
        "offloadedTimestamp": (5, OPT, VARINT),
        "endEntryId": (6, OPT, VARINT),
        "driverMetadata": (7, OPT, LEN),
    },
    ML.ManagedLedgerInfo.LedgerInfo: {
        "ledgerId": (1, REQ, VARINT),
        "entries": (2, OPT, VARINT),
        "size": (3, OPT, VARINT),
        "timestamp": (4, OPT, VARINT),
        "offloadContext": (5, OPT, LEN),
        "properties": (6, REP, LEN),
    },
    ML.ManagedLedgerInfo: {
        "ledgerInfo": (1, REP, LEN),
        "terminatedPosition": (2, OPT, LEN),
        "properties": (3, REP, LEN),
    },
    PA.KeyValue: {"key": (1, REQ, LEN), "value": (2, REQ, LEN)},
    PA.MessageMetadata: {
        "producer_name": (1, REQ, LEN),
        "sequence_id": (2, REQ, VARINT),
        "publish_time": (3, REQ, VARINT),
        "properties": (4, REP, LEN),
        "replicated_from": (5, OPT, LEN),
        "partition_key": (6, OPT, LEN),
        "replicate_to": (7, REP, LEN),
        "compression": (8, OPT, VARINT),
        "uncompressed_size": (9, OPT, VARINT),
        "num_messages_in_batch": (11, OPT, VARINT),
        "event_time": (12, OPT, VARINT),
        "schema_version": (16, OPT, LEN),
        "partition_key_b64_encoded": (17, OPT, VARINT),
        "ordering_key": (18, OPT, LEN),
        "deliver_at_time": (19, OPT, VARINT),
        "marker_type": (20, OPT, VARINT),
        "txnid_least_bits": (22, OPT, VARINT),
        "txnid_most_bits": (23, OPT, VARINT),
        "highest_sequence_id": (24, OPT, VARINT),
        "null_value": (25, OPT, VARINT),
        "uuid": (26, OPT, LEN),
        "num_chunks_from_msg": (27, OPT, VARINT),
        "total_chunk_msg_size": (28, OPT, VARINT),
        "chunk_id": (29, OPT, VARINT),
        "null_partition_key": (30, OPT, VARINT),
    },
    PA.SingleMessageMetadata: {
        "properties": (1, REP, LEN),
        "partition_key": (2, OPT, LEN),
        "payload_size": (3, REQ, VARINT),
        "compacted_out": (4, OPT, VARINT),
        "event_time": (5, OPT, VARINT),
        "partition_key_b64_encoded": (6, OPT, VARINT),
        "ordering_key": (7, OPT, LEN),
        "sequence_id": (8, OPT, VARINT),
        "null_value": (9, OPT, VARINT),
        "null_partition_key": (10, OPT, VARINT),
    },
    PA.BrokerEntryMetadata: {"broker_timestamp": (1, OPT, VARINT), "index": (2, OPT, VARINT)},
    # The schema registry's lookup (GetSchema).
    PA.Schema: {
        "name": (1, REQ, LEN),
        "schema_data": (3, REQ, LEN),
        "type": (4, REQ, VARINT),
        "properties": (5, REP, LEN),
    },
    PA.CommandGetSchema: {"request_id": (1, REQ, VARINT), "topic": (2, REQ, LEN), "schema_version": (3, OPT, LEN)},
    PA.CommandGetSchemaResponse: {
        "request_id": (1, REQ, VARINT),
        "error_code": (2, OPT, VARINT),
        "error_message": (3, OPT, LEN),
        "schema": (4, OPT, LEN),
        "schema_version": (5, OPT, LEN),
    },
}


def _label(fd: FieldDescriptor) -> str:
    try:
        repeated, required = fd.is_repeated, fd.is_required
    except AttributeError:  # runtimes before 6.32 have only the (since deprecated) label
        repeated = fd.label == FieldDescriptor.LABEL_REPEATED
        required = fd.label == FieldDescriptor.LABEL_REQUIRED
    return REP if repeated else REQ if required else OPT


FIELDS = [(cls, name, spec) for cls, fields in EXPECTED.items() for name, spec in fields.items()]


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _sample_value(fd: FieldDescriptor) -> object:
    if fd.type == FieldDescriptor.TYPE_STRING:
        return "s"
    if fd.type == FieldDescriptor.TYPE_BYTES:
        return b"b"
    if fd.type == FieldDescriptor.TYPE_BOOL:
        return True
    if fd.type == FieldDescriptor.TYPE_ENUM:
        return fd.enum_type.values[-1].number
    return 1


def _with_only(cls: type[ProtoMessage], name: str) -> ProtoMessage:
    msg = cls()
    fd = cls.DESCRIPTOR.fields_by_name[name]
    if fd.type == FieldDescriptor.TYPE_MESSAGE:
        sub = getattr(msg, name).add() if _label(fd) == REP else getattr(msg, name)
        sub.SetInParent()
    elif _label(fd) == REP:
        getattr(msg, name).append(_sample_value(fd))
    else:
        setattr(msg, name, _sample_value(fd))
    return msg


@pytest.mark.parametrize(("cls", "name", "spec"), FIELDS, ids=[f"{c.DESCRIPTOR.name}.{n}" for c, n, _ in FIELDS])
def test_field_serialises_with_pinned_tag(cls: type[ProtoMessage], name: str, spec: tuple[int, str, int]) -> None:
    number, label, wire_type = spec
    fd = cls.DESCRIPTOR.fields_by_name[name]
    assert (fd.number, _label(fd)) == (number, label)
    encoded = _with_only(cls, name).SerializePartialToString()
    assert encoded.startswith(_varint((number << 3) | wire_type)), encoded.hex()


@pytest.mark.parametrize("cls", list(EXPECTED), ids=[c.DESCRIPTOR.full_name for c in EXPECTED])
def test_no_unexpected_fields(cls: type[ProtoMessage]) -> None:
    # MessageMetadata's encryption fields 13-15 are deliberately absent (see pulsar_api.proto).
    assert set(cls.DESCRIPTOR.fields_by_name) == set(EXPECTED[cls])


def test_spot_checks_of_exact_bytes() -> None:
    assert ML.OffloadSegment(endEntryId=1).SerializeToString() == b"\x30\x01"
    assert ML.OffloadSegment(driverMetadata=ML.OffloadDriverMetadata(name="S3")).SerializeToString() == (
        b"\x3a\x04\x0a\x02S3"
    )
    assert ML.OffloadContext(offloadSegment=[ML.OffloadSegment(complete=True)]).SerializeToString() == (
        b"\x3a\x02\x18\x01"
    )
    assert ML.OffloadContext(uidMsb=-1).SerializeToString() == b"\x08" + b"\xff" * 9 + b"\x01"  # int64 varint
    assert ML.ManagedLedgerInfo.LedgerInfo(
        ledgerId=3, properties=[ML.KeyValue(key="k", value="v")]
    ).SerializeToString() == (b"\x08\x03\x32\x06\x0a\x01k\x12\x01v")
    assert PA.MessageMetadata(
        producer_name="", sequence_id=0, publish_time=0, null_partition_key=True
    ).SerializeToString() == bytes.fromhex("0a0010001800f00101")
    assert PA.SingleMessageMetadata(payload_size=0, sequence_id=5).SerializeToString() == b"\x18\x00\x40\x05"


def test_enum_values() -> None:
    assert {v.name: v.number for v in LMF.State.DESCRIPTOR.values} == {"OPEN": 1, "IN_RECOVERY": 2, "CLOSED": 3}
    assert {v.name: v.number for v in LMF.DigestType.DESCRIPTOR.values} == {
        "CRC32": 1,
        "HMAC": 2,
        "CRC32C": 3,
        "DUMMY": 4,
    }
    assert {v.name: v.number for v in PA.CompressionType.DESCRIPTOR.values} == {
        "NONE": 0,
        "LZ4": 1,
        "ZLIB": 2,
        "ZSTD": 3,
        "SNAPPY": 4,
    }
    assert LMF.DESCRIPTOR.fields_by_name["state"].default_value == LMF.OPEN
    assert PA.MessageMetadata.DESCRIPTOR.fields_by_name["num_messages_in_batch"].default_value == 1


@pytest.mark.parametrize("module", [bookkeeper_pb2, managed_ledger_pb2, pulsar_api_pb2])
def test_names_in_the_descriptor_pool_are_ours(module: object) -> None:
    # Another library registering its own PulsarApi.proto or DataFormats.proto must never clash with ours.
    fd = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert fd.name.startswith("streamoffload/codecs/proto/")
    assert fd.package.startswith("streamoffload.")
    assert not fd.dependencies  # no cross-file imports: protoc would emit a bare `import x_pb2`


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@pytest.mark.parametrize("name", ["bookkeeper", "managed_ledger", "pulsar_api"])
def test_generated_code_fits_the_pinned_runtime(name: str) -> None:
    # Generated code refuses to import under a runtime older than its gencode version: the lower
    # bound pinned in pyproject.toml must not be older than that.
    generated = (ROOT / "codecs" / "proto" / f"{name}_pb2.py").read_text()
    gencode = re.search(r"# Protobuf Python Version: ([\d.]+)", generated)
    assert gencode, "generated file lacks its version header; regenerate with scripts/gen_proto.sh"
    pin = re.search(r'"protobuf>=([\d.]+),<(\d+)"', (ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml must pin protobuf as >=X.Y.Z,<N"
    assert _version_tuple(pin.group(1)) >= _version_tuple(gencode.group(1))
    # And the .proto beside it is what was compiled: every field it declares is in the generated code.
    proto = (ROOT / "codecs" / "proto" / f"{name}.proto").read_text()
    declared = re.findall(r"^\s*(?:required|optional|repeated)\s+\S+\s+(\w+)\s*=\s*(\d+)", proto, re.M)
    module = {"bookkeeper": bookkeeper_pb2, "managed_ledger": managed_ledger_pb2, "pulsar_api": pulsar_api_pb2}[name]
    compiled: set[tuple[str, str]] = set()
    pending = list(module.DESCRIPTOR.message_types_by_name.values())
    while pending:
        desc = pending.pop()
        pending.extend(desc.nested_types)
        compiled.update((f.name, str(f.number)) for f in desc.fields)
    assert declared and set(declared) == compiled, "codecs/proto is stale: run scripts/gen_proto.sh"


def test_coexists_with_pulsar_client() -> None:
    import pulsar  # noqa: F401  (the official client, imported alongside our copies of its messages)

    assert PA.MessageMetadata.DESCRIPTOR.full_name == "streamoffload.pulsar.MessageMetadata"
