"""Pulsar's binary protocol on the wire (streamoffload/pulsar/wire.py): frames, and the protobuf helpers for the
fields the generated classes do not declare."""

from __future__ import annotations

import struct

import pulsar
from hypothesis import given, settings
from hypothesis import strategies as st

from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand
from streamoffload.pulsar.wire import (
    FRAME_HEADER,
    T,
    batch_size_of,
    field_bytes,
    field_varint,
    frame,
    proto_fields,
    request_id_of,
    server_error,
)


def test_batch_size_from_real_message_ids() -> None:
    assert batch_size_of(pulsar.MessageId(-1, 3, 4, 2).serialize()) == 0
    assert batch_size_of(bytes.fromhex("0801100020023003")) == 3  # read off a pulsar-lite batched id


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 50), st.integers(-(2**63), 2**64 - 1)), max_size=8))
def test_varint_fields_round_trip(fields: list[tuple[int, int]]) -> None:
    buf = b"".join(field_varint(n, v) for n, v in fields)
    decoded = [(n, v) for n, _w, v in proto_fields(buf)]
    assert decoded == [(n, v % 2**64) for n, v in fields]


def test_a_frame_counts_command_and_payload() -> None:
    cmd = BaseCommand(type=T.PING, ping={})
    body = cmd.SerializeToString()
    plain = frame(cmd)
    assert plain == struct.pack(">II", len(body) + 4, len(body)) + body
    with_payload = frame(cmd, b"entry")
    total, size = FRAME_HEADER.unpack_from(with_payload, 0)
    assert (total, size) == (4 + len(body) + 5, len(body)) and with_payload.endswith(b"entry")


def test_length_delimited_fields_round_trip() -> None:
    buf = field_bytes(2, b"public/default") + field_varint(3, 0)
    assert list(proto_fields(buf)) == [(2, 2, b"public/default"), (3, 0, 0)]


def test_answers_are_matched_by_request_id_and_errors_named() -> None:
    answer = BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE_RESPONSE)
    answer.getTopicsOfNamespaceResponse.request_id = 7
    assert request_id_of(answer) == 7
    assert request_id_of(BaseCommand(type=T.PING, ping={})) is None
    assert server_error(2) == "PersistenceError"
    assert server_error(999) == "999"
