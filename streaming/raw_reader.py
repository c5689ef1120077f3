"""Reading topic-partitions as the broker stores them: entries byte for byte, over Pulsar's binary protocol.

:func:`read_range_raw` is :func:`streamoffload.streaming.ranges.read_exactly_once` -- the loop the
``pulsar-client`` reader (:func:`streamoffload.streaming.pulsar_io.read_range`) uses too: exact
``(start, end]`` ranges, once each and in order, duplicates dropped, stalled readers re-opened at the
last emitted position, reconnects with backoff, data loss confirmed by one re-read -- over
:class:`RawConsumer`. It does not rebuild entries: each
``CommandMessage`` frame the broker pushes carries one stored entry as headers-and-payload::

    [u32 totalSize][u32 commandSize][BaseCommand{MESSAGE}]
    ([u16 0x0e02][u32 n][BrokerEntryMetadata])? [u16 0x0e01][u32 crc32c][u32 m][MessageMetadata][payload]

and everything after the command is the entry, emitted untouched: compression, sequence ids,
encryption, schema versions, chunking fields, null values and keys stay as the producer wrote them.
The CRC-32C is verified on receipt (a mismatch re-opens the reader, like any error) and the message
count comes from the metadata (``num_messages_in_batch``), without unpacking anything. pulsar-lite
hands entries out without their ``0x0e01`` checksum section (a pre-v6 layout ``decode_entry`` accepts,
as Pulsar does): there nothing can be verified, and the entries are the producer's bytes after it.

Broker entry metadata (``0x0e02``, PIP-70): a broker with ``brokerEntryMetadataInterceptors`` stores
it in front of every entry, so Pulsar's offloaders, which copy the stored ledger entries, keep it.
A broker sends it to a consumer only when the consumer says it supports it (protocol version >= 18
and ``FeatureFlags.supports_broker_entry_metadata``, both sent here) and the broker has
``exposingBrokerEntryMetadataToClientEnabled=true``; with that setting the entries read here are the
stored bytes exactly. Without it the broker strips the prefix before sending, and the entries are
the stored bytes minus that prefix (pulsar-lite has no broker entry metadata at all).

Protocol steps (field numbers in ``codecs/proto/pulsar_api.proto``, checked against upstream
``PulsarApi.proto``): ``CONNECT`` (protocol version 19, auth method and data, feature flags) ->
``CONNECTED`` (``AUTH_CHALLENGE`` answered with the same credentials), ``LOOKUP`` (``Redirect``
followed, ``Connect`` to the owning broker, ``proxy_through_service_url`` honoured by reconnecting to
the service URL with ``proxy_to_broker_url``), ``SUBSCRIBE`` (Exclusive, non-durable, a unique
subscription name, ``start_message_id`` = the last emitted position or earliest), ``FLOW`` permits
(counted in messages, topped up as they are used), ``MESSAGE`` frames, ``GET_LAST_MESSAGE_ID``,
cumulative ``ACK`` of what arrived (as Pulsar's own readers do), ``CLOSE_CONSUMER``; ``PING`` is
answered with ``PONG``.

Connection options (the source's ``pulsar.client.*`` options, prefix removed, names as
:func:`pulsar_io.client_kwargs` takes them): ``authToken`` or ``authPluginClassName`` +
``authParams`` for the token (``token:...``, ``file:...``), basic (``{"userId": .., "password": ..}``
or ``userId:..,password:..``) and TLS (``tlsCertFile:..,tlsKeyFile:..``) plugins; ``pulsar+ssl://``
with ``tlsTrustCertsFilePath``, ``tlsAllowInsecureConnection``, ``tlsValidateHostname``;
``connectionTimeoutMs`` and ``operationTimeoutSeconds``. Other plugins (OAuth2, custom) raise
:class:`ConfigError`: read such clusters with the ``pulsar-client`` reader.

TLS failures that configuration causes are not retried: a server certificate the trust settings do
not accept, or a server that requires a client certificate the options do not give, raise
:class:`~streamoffload.streaming.ranges.ReaderUnusable` naming the address and option; unreadable
certificate, key or trust files raise :class:`ConfigError`. What is tested against what:
``tests/source/test_raw_tls.py`` (TLS, through a TLS-terminating proxy in front of pulsar-lite) and
the module docstring of ``tests/source/test_raw_reader.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from streamoffload.codecs.entry import decode_entry, metadata_num_messages
from streamoffload.codecs.errors import FormatError
from streamoffload.codecs.proto.pulsar_api_pb2 import (
    BaseCommand,
    CommandAck,
    CommandLookupTopicResponse,
    CommandSubscribe,
    MessageIdData,
    ServerError,
)
from streamoffload.errors import ConfigError
from streamoffload.streaming.pulsar_io import (
    BEFORE_EARLIEST,
    CLIENT_OPTION_PREFIX,
    Entry,
    Position,
    Probe,
    PulsarIOError,
    ReaderSettings,
    ReadStats,
    ServiceAddress,
    _normalized,
    _parse_bool,
    _token_from_options,
)
from streamoffload.streaming.ranges import RangeConsumer, ReaderUnusable, read_exactly_once

log = logging.getLogger(__name__)

__all__ = [
    "ConnectionConfig",
    "RawClient",
    "RawConsumer",
    "RawMessage",
    "latest_position_raw",
    "probe_after_raw",
    "read_range_raw",
]

PROTOCOL_VERSION = 19  # v18 is the first that may receive broker entry metadata
CLIENT_VERSION = "streamoffload-raw-reader"
_HEADER = struct.Struct(">II")  # totalSize, commandSize
_MAX_FRAME = 128 << 20  # Pulsar's maxMessageSize is 5 MiB by default; a larger frame is corruption
_RECV_CHUNK = 1 << 18
_U64 = (1 << 64) - 1  # MessageId.earliest's -1, as the uint64 the protocol carries
_MAX_LOOKUP_HOPS = 8
_ACK_EVERY = 16  # entries between cumulative acks (brokers redeliver what a consumer never acks)

T = BaseCommand.Type


# ---------------------------------------------------------------------------------------------
# connection options


@dataclass(frozen=True)
class ConnectionConfig:
    """How to reach and authenticate to a cluster: parsed once from the ``pulsar.client.*`` options."""

    service: ServiceAddress
    auth_method: str | None = None
    auth_data: bytes | None = None
    tls_trust_certs_file: str | None = None
    tls_allow_insecure: bool = False
    tls_validate_hostname: bool = True
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    connect_timeout_s: float = 10.0
    operation_timeout_s: float = 30.0

    @classmethod
    def parse(cls, service_url: str, options: Mapping[str, str] | None = None) -> ConnectionConfig:
        options = options or {}
        opts = {k: v for k, (_orig, v) in _normalized(options).items()}
        service = ServiceAddress.parse(service_url)
        method: str | None = None
        data: bytes | None = None
        cert = key = None
        token = _token_from_options(options)
        plugin = opts.get("authpluginclassname", "")
        params = opts.get("authparams", "")
        if token is not None:
            method, data = "token", token.encode()
        elif plugin.endswith("AuthenticationBasic"):
            method, data = "basic", _basic_credentials(params)
        elif plugin.endswith("AuthenticationTls"):
            parts = dict(item.split(":", 1) for item in params.split(",") if ":" in item)
            cert, key = parts.get("tlsCertFile"), parts.get("tlsKeyFile")
            if not cert or not key:
                raise ConfigError(
                    f"option {CLIENT_OPTION_PREFIX}authParams: AuthenticationTls needs tlsCertFile:...,tlsKeyFile:..."
                )
            method = "tls"
        elif plugin:
            raise ConfigError(
                f"option {CLIENT_OPTION_PREFIX}authPluginClassName: the raw-entry reader supports token, basic and "
                f"TLS authentication, not {plugin}; use the pulsar-client reader for it"
            )

        def number(name: str, default: float, scale: float) -> float:
            if name not in opts:
                return default
            try:
                return float(opts[name]) * scale
            except ValueError as err:
                raise ConfigError(
                    f"option {CLIENT_OPTION_PREFIX}{name}: expected a number, got {opts[name]!r}"
                ) from err

        return cls(
            service=service,
            auth_method=method,
            auth_data=data,
            tls_trust_certs_file=opts.get("tlstrustcertsfilepath") or None,
            tls_allow_insecure=_parse_bool(
                opts.get("tlsallowinsecureconnection", "false"), "tlsAllowInsecureConnection"
            ),
            tls_validate_hostname=_parse_bool(opts.get("tlsvalidatehostname", "true"), "tlsValidateHostname"),
            tls_cert_file=cert,
            tls_key_file=key,
            connect_timeout_s=number("connectiontimeoutms", 10.0, 0.001),
            operation_timeout_s=number("operationtimeoutseconds", 30.0, 1.0),
        )


def _basic_credentials(params: str) -> bytes:
    """``userId:password``, Pulsar's basic auth data, from the plugin's JSON or ``k:v,k:v`` params."""
    user = password = None
    text = params.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError as err:
            raise ConfigError(f"option {CLIENT_OPTION_PREFIX}authParams: not valid JSON: {err}") from err
        user = parsed.get("userId", parsed.get("username"))
        password = parsed.get("password")
    else:
        parts = dict(item.split(":", 1) for item in text.split(",") if ":" in item)
        user = parts.get("userId", parts.get("username"))
        password = parts.get("password")
    if not user or password is None:
        raise ConfigError(
            f"option {CLIENT_OPTION_PREFIX}authParams: AuthenticationBasic needs userId and password "
            '(\'{"userId": "u", "password": "p"}\')'
        )
    return f"{user}:{password}".encode()


# ---------------------------------------------------------------------------------------------
# one connection


def _frame(command: BaseCommand) -> bytes:
    body = command.SerializeToString()
    return _HEADER.pack(len(body) + 4, len(body)) + body


def _server_error(code: int) -> str:
    return ServerError.Name(code) if code in ServerError.values() else str(code)


class _Connection:
    """One TCP (or TLS) connection that has completed the CONNECT handshake."""

    def __init__(self, config: ConnectionConfig, address: ServiceAddress, proxy_to_broker_url: str | None = None):
        self.config = config
        self.address = address
        self.name = f"{address.host}:{address.port}"
        self._buf = bytearray()
        self._pos = 0
        self._chunk = bytearray(_RECV_CHUNK)
        self._request_id = 0
        sock = socket.create_connection((address.host, address.port), timeout=config.connect_timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            if address.tls:
                sock = self._wrap_tls(sock)
            self.sock = sock
            connect = BaseCommand(type=T.CONNECT)
            c = connect.connect
            c.client_version = CLIENT_VERSION
            c.protocol_version = PROTOCOL_VERSION
            c.feature_flags.supports_broker_entry_metadata = True
            c.feature_flags.supports_auth_refresh = True
            if config.auth_method:
                c.auth_method_name = config.auth_method
            if config.auth_data is not None:
                c.auth_data = config.auth_data
            if proxy_to_broker_url:
                c.proxy_to_broker_url = proxy_to_broker_url
            deadline = time.monotonic() + config.operation_timeout_s
            request: BaseCommand | None = connect
            while True:
                got = self._connect_step(request, deadline)
                request = None
                if got is None:
                    raise PulsarIOError(f"{self.name}: no answer to CONNECT within {config.operation_timeout_s:g} s")
                cmd, _payload = got
                if cmd.type == T.CONNECTED:
                    self.server_version = cmd.connected.server_version
                    break
                if cmd.type == T.ERROR:
                    raise PulsarIOError(
                        f"{self.name} refused the connection: {cmd.error.message} ({_server_error(cmd.error.error)})"
                    )
        except BaseException:
            with contextlib.suppress(OSError):
                sock.close()
            raise

    def _connect_step(self, connect: BaseCommand | None, deadline: float) -> tuple[BaseCommand, bytes | None] | None:
        """Send CONNECT (when given) and read the next answer. A TLS server that wants a client
        certificate may refuse only now (TLS 1.3 sends its alert after the handshake)."""
        try:
            if connect is not None:
                self.send(connect)
            return self.read(deadline)
        except (ssl.SSLError, ConnectionError) as err:  # an alert, a reset, a broken pipe or a bare close
            if not self.address.tls:
                raise
            raise self._tls_refused(err) from err

    def _tls_refused(self, err: OSError) -> PulsarIOError:
        reason = str(err) or type(err).__name__
        how = (f"{CLIENT_OPTION_PREFIX}authPluginClassName=AuthenticationTls with "
               f"{CLIENT_OPTION_PREFIX}authParams=tlsCertFile:...,tlsKeyFile:...")
        if "CERTIFICATE_REQUIRED" in reason:
            # Configuration, not a passing fault: retrying would only delay the same refusal.
            return ReaderUnusable(f"TLS: {self.name} refused the connection: {reason}; "
                                  f"the server requires a client certificate ({how})")
        if not self.config.tls_cert_file:
            # The refusal may reach us as a bare close (the alert lost to a reset): a hint, and retried.
            return PulsarIOError(f"TLS: {self.name} refused the connection: {reason}; "
                                 f"if the server requires a client certificate, give one ({how})")
        return PulsarIOError(f"TLS: {self.name} refused the connection: {reason}")

    def _wrap_tls(self, sock: socket.socket) -> socket.socket:
        cfg = self.config
        try:
            context = ssl.create_default_context(cafile=cfg.tls_trust_certs_file)
        except (OSError, ssl.SSLError) as err:
            raise ConfigError(
                f"option {CLIENT_OPTION_PREFIX}tlsTrustCertsFilePath: cannot load {cfg.tls_trust_certs_file}: {err}"
            ) from err
        if cfg.tls_allow_insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif not cfg.tls_validate_hostname:
            context.check_hostname = False
        if cfg.tls_cert_file and cfg.tls_key_file:
            try:
                context.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
            except (OSError, ssl.SSLError) as err:
                raise ConfigError(
                    f"option {CLIENT_OPTION_PREFIX}authParams: cannot load tlsCertFile {cfg.tls_cert_file} / "
                    f"tlsKeyFile {cfg.tls_key_file}: {err}"
                ) from err
        try:
            return context.wrap_socket(sock, server_hostname=self.address.host)
        except ssl.SSLCertVerificationError as err:
            trust = (f"tlsTrustCertsFilePath={cfg.tls_trust_certs_file}" if cfg.tls_trust_certs_file
                     else "system trust store")
            # A server the configuration does not trust stays untrusted: fail now, not after the retry budget.
            raise ReaderUnusable(f"TLS: the certificate of {self.name} is not trusted ({trust}): {err}") from err
        except ssl.SSLError as err:
            raise self._tls_refused(err) from err

    def next_request_id(self) -> int:
        self._request_id += 1
        return self._request_id

    def send(self, command: BaseCommand) -> None:
        self.sock.sendall(_frame(command))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def read(self, deadline: float) -> tuple[BaseCommand, bytes | None] | None:
        """The next command and its payload (a MESSAGE's entry bytes), or None at ``deadline``.

        PING is answered and AUTH_CHALLENGE re-sends the credentials on the way. A partial frame at
        the deadline stays buffered, so a later call continues where this one stopped."""
        while True:
            got = self._next_frame()
            if got is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.sock.settimeout(remaining)
                try:
                    n = self.sock.recv_into(self._chunk)
                except TimeoutError:
                    return None
                if n == 0:
                    raise ConnectionError(f"{self.name} closed the connection")
                if self._pos and self._pos * 2 >= len(self._buf):
                    del self._buf[: self._pos]
                    self._pos = 0
                self._buf += memoryview(self._chunk)[:n]
                continue
            cmd, payload = got
            if cmd.type == T.PING:
                self.send(BaseCommand(type=T.PONG, pong={}))
                continue
            if cmd.type == T.AUTH_CHALLENGE:
                self._answer_challenge(cmd)
                continue
            return cmd, payload

    def _next_frame(self) -> tuple[BaseCommand, bytes | None] | None:
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            return None
        total, cmd_size = _HEADER.unpack_from(buf, pos)
        if cmd_size + 4 > total or total > _MAX_FRAME:
            raise PulsarIOError(f"bad frame from {self.name}: total size {total}, command size {cmd_size}")
        end = pos + 4 + total
        if len(buf) < end:
            return None
        cmd_end = pos + 8 + cmd_size
        with memoryview(buf) as mv:
            cmd = BaseCommand.FromString(mv[pos + 8 : cmd_end])
            payload = mv[cmd_end:end].tobytes() if end > cmd_end else None
        self._pos = end
        return cmd, payload

    def _answer_challenge(self, cmd: BaseCommand) -> None:
        reply = BaseCommand(type=T.AUTH_RESPONSE)
        r = reply.authResponse
        r.client_version = CLIENT_VERSION
        r.protocol_version = PROTOCOL_VERSION
        r.response.auth_method_name = self.config.auth_method or "none"
        r.response.auth_data = self.config.auth_data or b""
        self.send(reply)

    def request(self, command: BaseCommand, request_id: int, what: str) -> BaseCommand:
        """Send ``command`` and wait for the answer that carries ``request_id`` (other frames are skipped)."""
        self.send(command)
        deadline = time.monotonic() + self.config.operation_timeout_s
        while True:
            got = self.read(deadline)
            if got is None:
                raise PulsarIOError(f"{self.name}: no answer to {what} within {self.config.operation_timeout_s:g} s")
            cmd, _payload = got
            answer = _request_id_of(cmd)
            if answer == request_id:
                if cmd.type == T.ERROR:
                    raise PulsarIOError(f"{what} failed at {self.name}: {cmd.error.message} "
                                        f"({_server_error(cmd.error.error)})")
                return cmd

    def lookup(self, topic: str, authoritative: bool) -> CommandLookupTopicResponse:
        rid = self.next_request_id()
        cmd = BaseCommand(type=T.LOOKUP)
        cmd.lookupTopic.topic = topic
        cmd.lookupTopic.request_id = rid
        cmd.lookupTopic.authoritative = authoritative
        return self.request(cmd, rid, f"lookup of {topic}").lookupTopicResponse


def _request_id_of(cmd: BaseCommand) -> int | None:
    kind = cmd.type
    if kind == T.SUCCESS:
        return cmd.success.request_id
    if kind == T.ERROR:
        return cmd.error.request_id
    if kind == T.LOOKUP_RESPONSE:
        return cmd.lookupTopicResponse.request_id
    if kind == T.GET_LAST_MESSAGE_ID_RESPONSE:
        return cmd.getLastMessageIdResponse.request_id
    return None


# ---------------------------------------------------------------------------------------------
# client and consumer


class RawMessage(NamedTuple):
    """One entry as received: position, publish time (ms), message count and the stored bytes."""

    ledger_id: int
    entry_id: int
    publish_time: int
    num_messages: int
    data: bytes


class RawClient:
    """A cluster to read raw entries from: configuration only (each consumer has its own connection,
    so a stalled or broken consumer is dropped with its connection and nothing stale is read later)."""

    def __init__(self, service_url: str, options: Mapping[str, str] | None = None) -> None:
        self.service_url = service_url
        self.config = ConnectionConfig.parse(service_url, options)

    def close(self) -> None:
        """Nothing to release: connections belong to consumers."""

    def connect_for(self, topic: str) -> _Connection:
        """A connection to the broker that serves ``topic``, found by binary-protocol lookup."""
        cfg = self.config
        conn = _Connection(cfg, cfg.service)
        authoritative = False
        try:
            for _hop in range(_MAX_LOOKUP_HOPS):
                resp = conn.lookup(topic, authoritative)
                if resp.response == CommandLookupTopicResponse.Failed:
                    raise PulsarIOError(
                        f"lookup of {topic} at {conn.name} failed: {resp.message or 'no reason given'} "
                        f"({_server_error(resp.error)})"
                    )
                url = resp.brokerServiceUrlTls if cfg.service.tls else resp.brokerServiceUrl
                target = ServiceAddress.parse(url) if url else None
                if resp.proxy_through_service_url and target is not None:
                    # A proxy: keep talking to the service URL, asking it to forward to the broker.
                    conn.close()
                    conn = _Connection(cfg, cfg.service, proxy_to_broker_url=f"{target.host}:{target.port}")
                    if resp.response == CommandLookupTopicResponse.Connect:
                        return conn
                    authoritative = resp.authoritative
                    continue
                if target is None or (target.host, target.port) == (conn.address.host, conn.address.port):
                    # No URL for our scheme (e.g. a TLS terminator in front of a plain broker) or the
                    # broker we are talking to: stay on this connection.
                    if resp.response == CommandLookupTopicResponse.Connect or target is None:
                        return conn
                    authoritative = resp.authoritative
                    continue
                conn.close()
                conn = _Connection(cfg, target)
                if resp.response == CommandLookupTopicResponse.Connect:
                    return conn
                authoritative = resp.authoritative
            raise PulsarIOError(f"lookup of {topic} was redirected more than {_MAX_LOOKUP_HOPS} times")
        except BaseException:
            conn.close()
            raise

    def open_consumer(self, topic: str, after: Position, queue_size: int) -> RawConsumer:
        return RawConsumer(self, topic, after, queue_size)


class RawConsumer:
    """A non-durable Exclusive subscription that starts after ``after`` and receives raw entries."""

    def __init__(
        self, client: RawClient, topic: str, after: Position, queue_size: int, *, flow: bool = True
    ) -> None:
        self.topic = topic
        self.conn = client.connect_for(topic)
        self.consumer_id = 1
        self._queue = max(int(queue_size), 1)
        self._used = 0
        self._unacked = 0
        self._acked_to: Position = BEFORE_EARLIEST
        self._closed = False
        try:
            rid = self.conn.next_request_id()
            cmd = BaseCommand(type=T.SUBSCRIBE)
            s = cmd.subscribe
            s.topic = topic
            s.subscription = f"streamoffload-raw-{uuid.uuid4().hex[:16]}"
            s.subType = CommandSubscribe.Exclusive
            s.consumer_id = self.consumer_id
            s.request_id = rid
            s.durable = False
            s.read_compacted = False
            if after <= BEFORE_EARLIEST:
                s.start_message_id.CopyFrom(MessageIdData(ledgerId=_U64, entryId=_U64))
                s.initialPosition = CommandSubscribe.Earliest
            else:
                s.start_message_id.CopyFrom(MessageIdData(ledgerId=after[0], entryId=after[1]))
                s.initialPosition = CommandSubscribe.Earliest
            self.conn.request(cmd, rid, f"subscribing to {topic}")
            if flow:
                self._flow(self._queue)
        except BaseException:
            self.conn.close()
            raise

    def _ack(self) -> None:
        """Acknowledge cumulatively up to the highest position received, as Pulsar's readers do for
        their non-durable subscriptions: the broker then neither keeps nor redelivers those entries
        (pulsar-lite redelivers unacknowledged entries over and over)."""
        self._unacked = 0
        if self._acked_to < (0, 0):
            return
        cmd = BaseCommand(type=T.ACK)
        cmd.ack.consumer_id = self.consumer_id
        cmd.ack.ack_type = CommandAck.Cumulative
        cmd.ack.message_id.add(ledgerId=self._acked_to[0], entryId=self._acked_to[1])
        self.conn.send(cmd)

    def _flow(self, permits: int) -> None:
        cmd = BaseCommand(type=T.FLOW)
        cmd.flow.consumer_id = self.consumer_id
        cmd.flow.messagePermits = permits
        self.conn.send(cmd)

    def receive(self, timeout_ms: int) -> RawMessage | None:
        """The next entry, its CRC-32C verified; None when none arrives within ``timeout_ms``."""
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            got = self.conn.read(deadline)
            if got is None:
                return None
            cmd, payload = got
            kind = cmd.type
            if kind == T.MESSAGE:
                m = cmd.message
                if m.consumer_id != self.consumer_id:
                    continue
                if payload is None:
                    raise PulsarIOError(f"{self.topic}: message frame without an entry from {self.conn.name}")
                mid = m.message_id
                where = f"{self.topic} entry {mid.ledgerId}:{mid.entryId}"
                decoded = decode_entry(payload, where=where)  # checks the CRC-32C and the metadata
                count = metadata_num_messages(decoded.metadata)
                self._used += count
                self._unacked += 1
                if (mid.ledgerId, mid.entryId) > self._acked_to:
                    self._acked_to = (mid.ledgerId, mid.entryId)
                if self._unacked >= _ACK_EVERY or self._used >= (self._queue + 1) // 2:
                    self._ack()
                if self._used >= (self._queue + 1) // 2:
                    self._flow(self._used)
                    self._used = 0
                return RawMessage(mid.ledgerId, mid.entryId, decoded.metadata.publish_time, count, payload)
            if kind == T.CLOSE_CONSUMER:
                raise PulsarIOError(f"{self.topic}: the broker {self.conn.name} closed the consumer")
            if kind == T.ERROR:
                log.warning("%s: broker error: %s (%s)", self.topic, cmd.error.message, _server_error(cmd.error.error))

    def last_message_id(self) -> Position | None:
        """The broker's last position of the topic; None when it has no entry."""
        rid = self.conn.next_request_id()
        cmd = BaseCommand(type=T.GET_LAST_MESSAGE_ID)
        cmd.getLastMessageId.consumer_id = self.consumer_id
        cmd.getLastMessageId.request_id = rid
        try:
            answer = self.conn.request(cmd, rid, f"GetLastMessageId of {self.topic}")
        except PulsarIOError as err:
            if "no messages" in str(err).lower():  # pulsar-lite's answer for an empty topic
                return None
            raise
        last = answer.getLastMessageIdResponse.last_message_id
        ledger, entry = last.ledgerId, last.entryId
        if ledger >= 1 << 63 or entry >= 1 << 63:  # -1 as uint64
            return None
        return (ledger, entry)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            cmd = BaseCommand(type=T.CLOSE_CONSUMER)
            cmd.close_consumer.consumer_id = self.consumer_id
            cmd.close_consumer.request_id = self.conn.next_request_id()
            self.conn.send(cmd)
        self.conn.close()


# ---------------------------------------------------------------------------------------------
# positions


def latest_position_raw(client: RawClient, topic: str) -> Position | None:
    """The position of the last entry of a topic-partition (``GetLastMessageId`` on a non-durable
    subscription, which goes with its consumer), ``None`` when it has none."""
    try:
        consumer = RawConsumer(client, topic, BEFORE_EARLIEST, 1, flow=False)
    except (OSError, PulsarIOError) as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    try:
        return consumer.last_message_id()
    except (OSError, PulsarIOError) as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    finally:
        consumer.close()


def probe_after_raw(
    client: Any,
    topic: str,
    after: Position,
    *,
    settings: ReaderSettings | None = None,
    attempts: int = 3,
) -> Probe | None:
    """The first entry after ``after`` with its exact size and message count, or ``None`` if none
    arrives in ``attempts`` subscriptions."""
    settings = settings or ReaderSettings()
    timeout = max(settings.stall_timeout_ms, 500)
    for _ in range(attempts):
        try:
            consumer = client.open_consumer(topic, after, 1)
        except (OSError, PulsarIOError) as err:
            log.warning("%s: probe after %s could not subscribe: %s", topic, after, err)
            time.sleep(settings.initial_backoff_s)
            continue
        try:
            while True:
                msg = consumer.receive(timeout)
                if msg is None:
                    break
                pos = (msg.ledger_id, msg.entry_id)
                if pos <= after:
                    continue
                return Probe(pos, msg.num_messages, len(msg.data))
        except (OSError, PulsarIOError, FormatError) as err:
            log.warning("%s: probe after %s failed: %s", topic, after, err)
        finally:
            consumer.close()
        timeout = min(timeout * 2, settings.max_stall_timeout_ms)
    return None


# ---------------------------------------------------------------------------------------------
# reading ranges


def read_range_raw(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    *,
    settings: ReaderSettings | None = None,
    end_is_known: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[Entry]:
    """The stored entries of ``topic`` with positions in ``(start, end]``, in order, once each.

    ``client`` is a :class:`RawClient` (or anything with ``open_consumer(topic, after, queue_size)``
    returning a :class:`~streamoffload.streaming.ranges.RangeConsumer`). The contract, including
    ``end_is_known`` and the fault handling, is
    :func:`~streamoffload.streaming.ranges.read_exactly_once`'s, which this is.
    """
    settings = settings or ReaderSettings()

    def open_consumer(after: Position) -> RangeConsumer:
        return client.open_consumer(topic, after, settings.receiver_queue_size)

    # The stall timeout is not reset on progress: a broker that pauses every dozen entries (as
    # pulsar-lite does) would otherwise cost a re-subscription each time.
    return read_exactly_once(open_consumer, topic, start, end, settings=settings, end_is_known=end_is_known,
                             stats=stats)
