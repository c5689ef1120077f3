"""The direct binary-protocol connection (streamoffload/pulsar/broker_connection.py): topic listing with
``GetTopicsOfNamespace`` against pulsar-lite (which ignores it) and a hand-made broker that pins the
field numbers, and the readiness handshake."""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.pulsar.broker_connection import TopicListingUnsupported, list_topics, pulsar_handshake
from streamoffload.pulsar.exactly_once import PulsarIOError


def test_list_topics_on_pulsar_lite_says_it_is_unsupported(pulsar_broker: EmbeddedBroker) -> None:
    with pytest.raises(TopicListingUnsupported, match="no answer to GetTopicsOfNamespace within 1 s"):
        list_topics(pulsar_broker.service_url, "public/default", timeout=1)


def _fake_pulsar_server(topics: list[str], seen: list[bytes]) -> tuple[socket.socket, threading.Thread]:
    """A one-connection broker that answers CONNECT and GetTopicsOfNamespace with hand-made bytes,
    so the field numbers of PulsarApi.proto are pinned independently of the code under test."""
    server = socket.create_server(("127.0.0.1", 0))

    def frame(command: bytes) -> bytes:
        return struct.pack(">II", len(command) + 4, len(command)) + command

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            for _ in range(2):
                _total, size = struct.unpack(">II", conn.recv(8, socket.MSG_WAITALL))
                command = conn.recv(size, socket.MSG_WAITALL)
                seen.append(command)
                if command[:2] == b"\x08\x02":  # type CONNECT
                    # BaseCommand{type=CONNECTED(3), connected(3)={server_version(1)="fake"}}
                    conn.sendall(frame(b"\x08\x03\x1a\x06\x0a\x04fake"))
                else:
                    # a PING first (must be answered and skipped), then
                    # BaseCommand{type=33, getTopicsOfNamespaceResponse(33)={request_id(1)=1, topics(2)...}}
                    conn.sendall(frame(b"\x08\x12\x92\x01\x00"))
                    body = b"\x08\x01" + b"".join(b"\x12" + bytes([len(t)]) + t.encode() for t in topics)
                    conn.sendall(frame(b"\x08\x21\x8a\x02" + bytes([len(body)]) + body))
                    conn.recv(64)  # the PONG

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def test_list_topics_speaks_get_topics_of_namespace() -> None:
    topics = ["persistent://public/default/a-partition-0", "persistent://public/default/b"]
    seen: list[bytes] = []
    server, thread = _fake_pulsar_server(topics, seen)
    try:
        port = server.getsockname()[1]
        assert list_topics(f"pulsar://127.0.0.1:{port}", "public/default", timeout=5) == topics
        thread.join(5)
    finally:
        server.close()
    request = seen[1]
    # type GET_TOPICS_OF_NAMESPACE(32), field 32 = {request_id(1)=1, namespace(2)="public/default", mode(3)=0}
    assert request == b"\x08\x20\x82\x02\x14\x08\x01\x12\x0epublic/default\x18\x00"


def test_list_topics_unreachable_is_a_clear_error() -> None:
    from streamoffload.embedded_broker import free_port

    with pytest.raises(PulsarIOError, match="cannot list topics of 'public/default'"):
        list_topics(f"pulsar://127.0.0.1:{free_port()}", "public/default", timeout=1)


def test_list_topics_refuses_authentication_it_cannot_speak() -> None:
    with pytest.raises(PulsarIOError, match=r"supports no authentication or token authentication, not .*Basic"):
        list_topics(
            "pulsar://127.0.0.1:1",
            "public/default",
            client_options={"authPluginClassName": "AuthenticationBasic", "authParams": "userId:u,password:p"},
        )


def test_handshake_with_something_that_is_not_a_broker_is_false() -> None:
    """A server that answers CONNECT with bytes that are no Pulsar frame: not a broker, no exception."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(1024)
            conn.sendall(struct.pack(">II", 12, 8) + b"\xff" * 8)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        assert not pulsar_handshake("127.0.0.1", server.getsockname()[1], timeout=2)
    finally:
        thread.join(5)
        server.close()


def test_handshake_with_the_embedded_broker_is_true(pulsar_broker: EmbeddedBroker) -> None:
    assert pulsar_handshake("127.0.0.1", pulsar_broker.port)


def test_frames_are_read_whole_however_the_bytes_arrive() -> None:
    """Large payloads go straight into their own buffers (``_DIRECT_PAYLOAD``), small frames through the
    connection's buffer: frames split into small pieces, several in one segment, a large frame whose rest comes
    after a read's deadline (it waits for the next read) all come out whole and in order."""
    from streamoffload.codecs.proto.pulsar_api_pb2 import BaseCommand
    from streamoffload.pulsar.broker_connection import _DIRECT_PAYLOAD, BrokerConnection
    from streamoffload.pulsar.client_options import ConnectionConfig, ServiceAddress
    from streamoffload.pulsar.wire import T, frame

    def message(entry: int, payload: bytes) -> bytes:
        cmd = BaseCommand(type=T.MESSAGE)
        cmd.message.consumer_id = 1
        cmd.message.message_id.ledgerId = 7
        cmd.message.message_id.entryId = entry
        return frame(cmd, payload)

    payloads = [bytes([n]) * size for n, size in enumerate([100_000, 10, _DIRECT_PAYLOAD, 5, 300_000, 70_000], 1)]
    frames = [message(i, p) for i, p in enumerate(payloads)]
    server = socket.create_server(("127.0.0.1", 0))
    release = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            _total, size = struct.unpack(">II", conn.recv(8, socket.MSG_WAITALL))
            conn.recv(size, socket.MSG_WAITALL)
            conn.sendall(frame(BaseCommand(type=T.CONNECTED, connected={"server_version": "fake"})))
            first = frames[0]
            for i in range(0, len(first), 7_001):  # the first in small pieces, each its own recv
                conn.sendall(first[i : i + 7_001])
                time.sleep(0.001)
            conn.sendall(b"".join(frames[1:4]))  # a small, a large and a small frame together
            conn.sendall(frames[4][:150_000])  # half of a large frame, the rest after a deadline
            release.wait(10)
            conn.sendall(frames[4][150_000:] + frames[5])
            conn.recv(1)  # until the client closes

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = ServiceAddress("127.0.0.1", server.getsockname()[1], False)
    got: list[tuple[int, bytes | bytearray | None]] = []
    try:
        with BrokerConnection(ConnectionConfig(service=address), address) as conn:
            while len(got) < 4:
                read = conn.read(time.monotonic() + 10)
                assert read is not None
                got.append((read[0].message.message_id.entryId, read[1]))
            assert conn.read(time.monotonic() + 0.3) is None  # half a frame: nothing yet, kept
            release.set()
            while len(got) < 6:
                read = conn.read(time.monotonic() + 10)
                assert read is not None
                got.append((read[0].message.message_id.entryId, read[1]))
    finally:
        release.set()
        server.close()
    assert [entry for entry, _ in got] == list(range(6))
    assert [bytes(p or b"") for _, p in got] == payloads
    # Large frames that arrived in pieces were received into buffers of their own (the direct path); small
    # frames, and large ones already whole in the connection's buffer, were copied out of it.
    kinds = [type(p) for _, p in got]
    assert kinds[0] is bytearray and kinds[4] is bytearray, kinds
    assert kinds[1] is bytes and kinds[3] is bytes, kinds
