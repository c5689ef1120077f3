"""Reading Pulsar topic-partitions by exact position ranges, in plain Python (no Spark).

This is the I/O half of the Spark source (``streaming/source.py``); tests and benchmarks call it
directly. Positions are ``(ledger_id, entry_id)`` tuples and compare as tuples, as Pulsar orders
them. :data:`BEFORE_EARLIEST` ``(-1, -1)`` sorts before every real position.

:func:`read_range` yields the complete entries of a topic-partition in ``(start, end]`` exactly
once and in order, even from a broker that misbehaves: the loop that guarantees it (duplicates
dropped, stalled readers re-opened, outages retried with backoff, data loss confirmed by one re-read)
is :func:`streamoffload.streaming.ranges.read_exactly_once`, shared with the raw-entry reader. What
is particular to this reader is :class:`_ClientEntries`, its consumer: the messages the client unpacks
from a batched entry are regrouped by ``(ledger, entry)`` (the batch size comes from
``MessageId.serialize()``, Pulsar's ``MessageIdData`` field 6) and an entry is handed over only when
all its messages arrived in order; anything else re-opens the reader. Positions, :class:`Entry`,
:class:`ReaderSettings`, :class:`ReadStats` and the errors live in ``streaming/ranges.py`` and are
re-exported here.

This is the ``pulsar-client`` reader, the Spark source's fallback (option ``reader=client``); the
source's default is the raw-entry reader (``streaming/raw_reader.py``, same contract), which emits
each stored entry byte for byte. Here the ``entry`` bytes are rebuilt in Pulsar's headers-and-payload
format with :func:`streamoffload.codecs.entry.build_entry` from the messages of the entry: payloads,
keys, properties, event times, ordering keys, producer name and publish time are exact. What the
Python client does not expose is not carried, and only this reader loses it: sequence ids (rebuilt
entries number from 0), compression (the client decompresses, so payloads are stored uncompressed),
encryption, schema versions, and the difference between an empty and a missing key.

Also here: the latest position of a topic-partition (:func:`latest_position`), a probe for the
first entry after a position (:func:`probe_after`, for admission control), topic listing through
the binary protocol's ``GetTopicsOfNamespace`` (:func:`list_topics`, for ``topicsPattern``), the
``pulsar.client.*`` option mapping and a per-process client cache.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from streamoffload.codecs.entry import Message, build_entry
from streamoffload.errors import ConfigError
from streamoffload.streaming.ranges import BEFORE_EARLIEST as BEFORE_EARLIEST
from streamoffload.streaming.ranges import DataLossError as DataLossError
from streamoffload.streaming.ranges import Entry as Entry
from streamoffload.streaming.ranges import Position as Position
from streamoffload.streaming.ranges import PulsarIOError as PulsarIOError
from streamoffload.streaming.ranges import ReaderSettings as ReaderSettings
from streamoffload.streaming.ranges import ReaderUnusable, Resync, read_exactly_once
from streamoffload.streaming.ranges import ReadStats as ReadStats

log = logging.getLogger(__name__)

PULSAR_LOGGER = "streamoffload.pulsar"


def pulsar_logger() -> logging.Logger:
    """The Python logger to give ``pulsar.Client(logger=...)``: the C++ client's lines then go where every other
    log line goes (never to stdout, where they would break ``produce --json | jq``)."""
    return logging.getLogger(PULSAR_LOGGER)

# A batch index past any real one: a reader started after (L, E, this) skips every message of
# entry (L, E), batched or not, instead of delivering a batched entry again.
_AFTER_ALL_BATCH_INDEXES = 2**31 - 1


class TopicListingUnsupported(PulsarIOError):
    """The broker does not answer ``GetTopicsOfNamespace`` (pulsar-lite 0.2 ignores the command)."""


# ---------------------------------------------------------------------------------------------
# protobuf wire format, just enough for MessageIdData and a few broker commands


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int32/int64 negatives are encoded as 10-byte varints
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def proto_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` of each field of a protobuf message; varints as ints,
    length-delimited fields as bytes, fixed-size fields as ints."""
    pos = 0
    end = len(buf)
    while pos < end:
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: int | bytes
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > end:
                raise ValueError(f"field {number} of {size} bytes runs past the message end")
            value = bytes(buf[pos : pos + size])
            pos += size
        elif wire == 1:
            if pos + 8 > end:
                raise ValueError("truncated fixed64")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire == 5:
            if pos + 4 > end:
                raise ValueError("truncated fixed32")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire} for field {number}")
        yield number, wire, value


def batch_size_of(serialized_message_id: bytes) -> int:
    """The batch size in a serialized ``MessageIdData`` (field 6), 0 when absent (not batched)."""
    for number, wire, value in proto_fields(serialized_message_id):
        if number == 6 and wire == 0:
            return int(value)  # type: ignore[arg-type]
    return 0


# ---------------------------------------------------------------------------------------------
# a tiny binary-protocol session: handshake and GetTopicsOfNamespace (no admin API on pulsar-lite)

_CMD_CONNECT = 2
_CMD_CONNECTED = 3
_CMD_ERROR = 14
_CMD_PING = 18
_CMD_PONG = 19
_CMD_GET_TOPICS_OF_NAMESPACE = 32
_CMD_GET_TOPICS_OF_NAMESPACE_RESPONSE = 33
_PROTOCOL_VERSION = 6  # old enough for any broker; the commands used here predate it


def _field_varint(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def _field_bytes(number: int, value: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(value)) + value


def _frame(command_type: int, field_number: int, body: bytes) -> bytes:
    command = _field_varint(1, command_type) + _field_bytes(field_number, body)
    return struct.pack(">II", len(command) + 4, len(command)) + command


@dataclass(frozen=True)
class ServiceAddress:
    host: str
    port: int
    tls: bool

    @classmethod
    def parse(cls, service_url: str) -> ServiceAddress:
        parts = urlsplit(service_url.strip())
        if parts.scheme not in ("pulsar", "pulsar+ssl"):
            raise ConfigError(f"serviceUrl {service_url!r}: expected pulsar://HOST:PORT or pulsar+ssl://HOST:PORT")
        tls = parts.scheme == "pulsar+ssl"
        first = parts.netloc.split(",")[0]  # a multi-host URL: the first host answers as well as any
        host, _, port_text = first.rpartition(":")
        if not host:
            host, port_text = first, ""
        try:
            port = int(port_text) if port_text else (6651 if tls else 6650)
        except ValueError as err:
            raise ConfigError(f"serviceUrl {service_url!r}: bad port {port_text!r}") from err
        return cls(host.strip("[]"), port, tls)


class _ProtocolSession:
    """One connection speaking just enough of the Pulsar binary protocol for our probes."""

    def __init__(
        self,
        address: ServiceAddress,
        *,
        timeout: float = 10.0,
        auth_method: str | None = None,
        auth_data: bytes | None = None,
        tls_trust_certs_file: str | None = None,
        tls_allow_insecure: bool = False,
    ) -> None:
        self.address = address
        sock = socket.create_connection((address.host, address.port), timeout=timeout)
        try:
            sock.settimeout(timeout)
            if address.tls:
                context = ssl.create_default_context(cafile=tls_trust_certs_file)
                if tls_allow_insecure:
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                sock = context.wrap_socket(sock, server_hostname=address.host)
            self.sock = sock
            self._request_id = 0
            connect = _field_bytes(1, b"streamoffload") + _field_varint(4, _PROTOCOL_VERSION)
            if auth_method:
                connect += _field_bytes(5, auth_method.encode())
            if auth_data is not None:
                connect += _field_bytes(3, auth_data)
            self.sock.sendall(_frame(_CMD_CONNECT, 2, connect))
            kind, body = self._receive({_CMD_CONNECTED, _CMD_ERROR})
            if kind != _CMD_CONNECTED:
                raise PulsarIOError(f"{address.host}:{address.port} refused the connection: {_error_text(body)}")
        except BaseException:
            sock.close()
            raise

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> _ProtocolSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _recv_exact(self, size: int) -> bytes:
        buf = bytearray()
        while len(buf) < size:
            chunk = self.sock.recv(size - len(buf))
            if not chunk:
                raise ConnectionError(f"{self.address.host}:{self.address.port} closed the connection")
            buf.extend(chunk)
        return bytes(buf)

    def _receive(self, wanted: set[int]) -> tuple[int, bytes]:
        """The next command of a wanted type (answering pings on the way): ``(type, its body)``."""
        while True:
            total, cmd_size = struct.unpack(">II", self._recv_exact(8))
            if cmd_size > total or total > 64 << 20:
                raise PulsarIOError(f"bad frame from {self.address.host}:{self.address.port}: {total}/{cmd_size}")
            command = self._recv_exact(cmd_size)
            self._recv_exact(total - 4 - cmd_size)  # a payload, if any: not used here
            kind = 0
            bodies: dict[int, bytes] = {}
            for number, _wire, value in proto_fields(command):
                if number == 1:
                    kind = int(value)  # type: ignore[arg-type]
                elif isinstance(value, bytes):
                    bodies[number] = value
            if kind == _CMD_PING:
                self.sock.sendall(_frame(_CMD_PONG, 19, b""))
                continue
            if kind in wanted:
                # The body field of a command has the same number as its type for these commands.
                return kind, bodies.get(kind, b"")

    def topics_of_namespace(self, namespace: str, mode: int = 0) -> list[str]:
        """Topic names of ``tenant/namespace`` (``mode`` 0 persistent, 1 non-persistent, 2 all);
        partitioned topics are listed by their partitions, as Pulsar's broker does."""
        self._request_id += 1
        body = _field_varint(1, self._request_id) + _field_bytes(2, namespace.encode()) + _field_varint(3, mode)
        self.sock.sendall(_frame(_CMD_GET_TOPICS_OF_NAMESPACE, 32, body))
        kind, reply = self._receive({_CMD_GET_TOPICS_OF_NAMESPACE_RESPONSE, _CMD_ERROR})
        if kind == _CMD_ERROR:
            raise PulsarIOError(f"listing topics of namespace {namespace!r} failed: {_error_text(reply)}")
        return [v.decode() for n, _w, v in proto_fields(reply) if n == 2 and isinstance(v, bytes)]


def _error_text(body: bytes) -> str:
    code, message = None, ""
    with contextlib.suppress(ValueError):
        for number, _wire, value in proto_fields(body):
            if number == 2 and isinstance(value, int):
                code = value
            elif number == 3 and isinstance(value, bytes):
                message = value.decode("utf-8", "replace")
    return f"{message or 'error'} (server error code {code})"


def pulsar_handshake(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when ``host:port`` answers a Pulsar ``CONNECT`` with ``CONNECTED``."""
    try:
        with _ProtocolSession(ServiceAddress(host, port, False), timeout=timeout):
            return True
    except (OSError, ValueError, PulsarIOError):
        return False


def list_topics(
    service_url: str,
    namespace: str,
    *,
    client_options: Mapping[str, str] | None = None,
    timeout: float = 5.0,
) -> list[str]:
    """Persistent topics (and topic-partitions) of ``tenant/namespace``, via ``GetTopicsOfNamespace``.

    This is how Pulsar's own clients resolve a topics pattern. pulsar-lite (0.2) ignores the command:
    after ``timeout`` this raises :class:`TopicListingUnsupported`.

    Works over ``pulsar://`` and ``pulsar+ssl://`` without authentication or with token
    authentication (``pulsar.client.authToken`` or an ``AuthenticationToken`` plugin in
    ``client_options``, the source's ``pulsar.client.*`` options without the prefix). Other
    authentication methods raise :class:`PulsarIOError`; list the topics explicitly instead.
    """
    opts = {k: v for k, (_orig, v) in _normalized(client_options or {}).items()}
    token = _token_from_options(client_options or {})
    plugin = opts.get("authpluginclassname", "")
    if plugin and token is None:
        raise PulsarIOError(
            f"topic discovery (topicsPattern) supports no authentication or token authentication, not {plugin}; "
            "list the topics with the 'topics' option instead"
        )
    address = ServiceAddress.parse(service_url)
    try:
        with _ProtocolSession(
            address,
            timeout=timeout,
            auth_method="token" if token is not None else None,
            auth_data=token.encode() if token is not None else None,
            tls_trust_certs_file=opts.get("tlstrustcertsfilepath"),
            tls_allow_insecure=_parse_bool(
                opts.get("tlsallowinsecureconnection", "false"), "tlsAllowInsecureConnection"
            ),
        ) as session:
            return session.topics_of_namespace(namespace)
    except TimeoutError as err:
        raise TopicListingUnsupported(
            f"cannot list topics of {namespace!r} at {service_url}: no answer to GetTopicsOfNamespace within "
            f"{timeout:g} s (pulsar-lite ignores this command; give the topics or topicsPatternCandidates)"
        ) from err
    except (OSError, ValueError) as err:
        raise PulsarIOError(f"cannot list topics of {namespace!r} at {service_url}: {err}") from err


# ---------------------------------------------------------------------------------------------
# clients and the pulsar.client.* options

CLIENT_OPTION_PREFIX = "pulsar.client."
_EXCLUDED_PARAMS = ("self", "service_url", "authentication", "logger")


def _norm(key: str) -> str:
    """Option names compare without case, ``_`` or ``-``: Spark lower-cases data source option
    names, so ``operationTimeoutSeconds`` arrives as ``operationtimeoutseconds``."""
    return key.replace("_", "").replace("-", "").lower()


def _parse_bool(text: str, key: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise ConfigError(f"option {CLIENT_OPTION_PREFIX}{key}: expected true or false, got {text!r}")


def _normalized(options: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    return {_norm(k): (k, v) for k, v in options.items()}


def _token_from_options(options: Mapping[str, str]) -> str | None:
    opts = {k: v for k, (_orig, v) in _normalized(options).items()}
    if "authtoken" in opts:
        return opts["authtoken"]
    plugin = opts.get("authpluginclassname", "")
    if plugin.endswith("AuthenticationToken"):
        params = opts.get("authparams", "")
        if params.startswith("token:"):
            return params[len("token:") :]
        if params.startswith("file:"):
            with open(params[len("file:") :], encoding="utf-8") as fh:
                return fh.read().strip()
        return params
    return None


def client_options(options: Mapping[str, str]) -> dict[str, str]:
    """The ``pulsar.client.*`` entries of a source's options, without the prefix."""
    prefix = CLIENT_OPTION_PREFIX.lower()
    return {k[len(prefix) :]: v for k, v in options.items() if k.lower().startswith(prefix)}


def client_kwargs(options: Mapping[str, str]) -> dict[str, Any]:
    """Keyword arguments for ``pulsar.Client`` from ``pulsar.client.*`` options (prefix removed).

    Names match the Python client's parameters without regard to case or underscores, so Java-style
    names work (``operationTimeoutSeconds`` -> ``operation_timeout_seconds``,
    ``tlsTrustCertsFilePath``, ``connectionTimeoutMs``, ``ioThreads``, ...); values are converted to
    the parameter's type. Authentication: ``authToken``, or Pulsar's ``authPluginClassName`` +
    ``authParams`` (the token, TLS, basic and OAuth2 plugins by class name; any other name is loaded
    as a C++ plugin library path). ``logLevel`` (debug|info|warn|error) sets the client's console log
    level (default warn). An unknown name raises :class:`ConfigError`.
    """
    import pulsar

    signature = inspect.signature(pulsar.Client.__init__)
    params = {_norm(name): name for name in signature.parameters if name not in _EXCLUDED_PARAMS}
    special = {"authtoken", "authpluginclassname", "authparams", "loglevel"}
    opts = _normalized(options)
    kwargs: dict[str, Any] = {}
    for norm, (key, text) in opts.items():
        if norm in special:
            continue
        name = params.get(norm)
        if name is None:
            raise ConfigError(
                f"option {CLIENT_OPTION_PREFIX}{key}: pulsar.Client has no such parameter "
                f"(known: {', '.join(sorted(params.values()))}, plus authToken, authPluginClassName, "
                "authParams, logLevel)"
            )
        default = signature.parameters[name].default
        try:
            if isinstance(default, bool):
                kwargs[name] = _parse_bool(text, key)
            elif isinstance(default, int):
                kwargs[name] = int(text)
            else:
                kwargs[name] = text
        except ValueError as err:
            raise ConfigError(f"option {CLIENT_OPTION_PREFIX}{key}: expected an integer, got {text!r}") from err

    token = _token_from_options(options)
    plugin = opts.get("authpluginclassname", ("", ""))[1]
    auth_params = opts.get("authparams", ("", ""))[1]
    if token is not None:
        kwargs["authentication"] = pulsar.AuthenticationToken(token)
    elif plugin.endswith("AuthenticationTls"):
        parts = dict(item.split(":", 1) for item in auth_params.split(",") if ":" in item)
        kwargs["authentication"] = pulsar.AuthenticationTLS(parts.get("tlsCertFile", ""), parts.get("tlsKeyFile", ""))
    elif plugin.endswith("AuthenticationBasic"):
        kwargs["authentication"] = pulsar.AuthenticationBasic(auth_params_string=auth_params)
    elif plugin.lower().endswith("authenticationoauth2"):
        kwargs["authentication"] = pulsar.AuthenticationOauth2(auth_params)
    elif plugin:
        kwargs["authentication"] = pulsar.Authentication(plugin, auth_params)

    levels = {
        "debug": pulsar.LoggerLevel.Debug,
        "info": pulsar.LoggerLevel.Info,
        "warn": pulsar.LoggerLevel.Warn,
        "error": pulsar.LoggerLevel.Error,
    }
    level = opts.get("loglevel", ("", "warn"))[1].strip().lower()
    if level not in levels:
        raise ConfigError(f"option {CLIENT_OPTION_PREFIX}logLevel: expected one of {', '.join(levels)}, got {level!r}")
    kwargs["logger"] = pulsar.ConsoleLogger(levels[level])
    return kwargs


def make_client(service_url: str, options: Mapping[str, str] | None = None) -> Any:
    """A new ``pulsar.Client`` for ``service_url`` with ``pulsar.client.*`` options (prefix removed)."""
    import pulsar

    kwargs = client_kwargs(options or {})
    try:
        return pulsar.Client(service_url, **kwargs)
    except Exception as err:  # the C++ client raises plain exceptions with the reason
        raise PulsarIOError(f"cannot create a Pulsar client for {service_url}: {err}") from err


_CLIENTS: dict[tuple[int, str, tuple[tuple[str, str], ...]], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def shared_client(service_url: str, options: Mapping[str, str] | None = None) -> Any:
    """One client per process and configuration, reused across calls (and Spark tasks of a reused
    Python worker): creating a client costs a connection and threads."""
    key = (os.getpid(), service_url, tuple(sorted((options or {}).items())))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = make_client(service_url, options)
            _CLIENTS[key] = client
        return client


def close_shared_clients() -> None:
    with _CLIENTS_LOCK:
        clients = list(_CLIENTS.values())
        _CLIENTS.clear()
    for client in clients:
        with contextlib.suppress(Exception):
            client.close()


# ---------------------------------------------------------------------------------------------
# positions


def topic_partitions(client: Any, topic: str) -> list[str]:
    """The partitions of ``topic`` (``[topic]`` for a non-partitioned one), from the broker's metadata."""
    try:
        return list(client.get_topic_partitions(topic))
    except Exception as err:
        raise PulsarIOError(f"cannot look up the partitions of {topic}: {err}") from err


def latest_position(client: Any, topic: str) -> Position | None:
    """The position of the last entry of a topic-partition, ``None`` when it has none.

    Pulsar's Python client exposes the last message id only on a consumer, so this subscribes
    under a unique name, asks, and unsubscribes again (a durable subscription left behind would
    hold the topic's data on a real broker). pulsar-lite answers an empty topic with an error
    ("Topic has no messages", seen as ``UnknownError``), taken as empty.
    """
    import pulsar

    name = f"streamoffload-latest-{uuid.uuid4().hex[:16]}"
    try:
        consumer = client.subscribe(
            topic,
            name,
            receiver_queue_size=1,
            initial_position=pulsar.InitialPosition.Latest,
        )
    except Exception as err:
        raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
    try:
        try:
            last = consumer.get_last_message_id()
        except pulsar.exceptions.UnknownError:
            return None
        except Exception as err:
            raise PulsarIOError(f"cannot ask {topic} for its last entry: {err}") from err
        ledger, entry = last.ledger_id(), last.entry_id()
        if ledger < 0 or entry < 0:
            return None
        return (ledger, entry)
    finally:
        try:
            consumer.unsubscribe()
        except Exception:
            log.warning("could not remove the probe subscription %s on %s", name, topic)
        with contextlib.suppress(Exception):
            consumer.close()


# ---------------------------------------------------------------------------------------------
# reading ranges


def _open_reader(client: Any, topic: str, after: Position, settings: ReaderSettings) -> Any:
    import pulsar

    if after <= BEFORE_EARLIEST:
        start = pulsar.MessageId.earliest
    else:
        start = pulsar.MessageId(-1, after[0], after[1], _AFTER_ALL_BATCH_INDEXES)
    return client.create_reader(topic, start, receiver_queue_size=settings.receiver_queue_size)


def _message_fields(msg: Any) -> Message:
    ordering = msg.ordering_key()
    return Message(
        msg.data(),
        msg.partition_key() or None,
        msg.properties(),
        msg.event_timestamp(),
        (ordering.encode() if isinstance(ordering, str) else ordering) or None,
    )


def _build(topic: str, pos: Position, msgs: list[Any], batched: bool) -> Entry:
    first = msgs[0]
    publish_time = first.publish_timestamp()
    data = build_entry(
        [_message_fields(m) for m in msgs],
        producer_name=first.producer_name(),
        sequence_id=0,
        publish_time=publish_time,
        batched=batched,
    )
    return Entry(topic, pos[0], pos[1], publish_time, len(msgs), data)


class _ClientEntries:
    """The ``pulsar-client`` reader as a :class:`~streamoffload.streaming.ranges.RangeConsumer`: it
    regroups the messages the client unpacks from a batched entry by ``(ledger, entry)`` and hands
    over whole entries, rebuilt with :func:`build_entry`.

    The batch size comes from ``MessageId.serialize()`` (Pulsar's ``MessageIdData``, field 6). An
    entry is handed over only when all its messages arrived in order; anything else raises
    :class:`Resync`. Messages at or before the last entry handed over are duplicates (counted in
    ``stats``); an entry past ``end`` is handed over at its first message (the loop only needs its
    position there)."""

    def __init__(self, client: Any, topic: str, after: Position, end: Position, settings: ReaderSettings,
                 stats: ReadStats) -> None:
        import pulsar

        self._timeout_error = pulsar.Timeout
        self.topic = topic
        self.end = end
        self.after = after
        self.stats = stats
        try:
            self.reader = _open_reader(client, topic, after, settings)
        except Exception as err:
            raise PulsarIOError(f"opening a reader: {err}") from err
        # The C++ binding's reader, without the Python wrapper's per-message object: same methods,
        # a few microseconds less per message.
        self._read_next = getattr(self.reader, "_reader", self.reader).read_next

    def _next(self, timeout_ms: int) -> Any:
        try:
            return self._read_next(timeout_ms)
        except self._timeout_error:
            return None
        except Exception as err:
            raise PulsarIOError(str(err)) from err

    def receive(self, timeout_ms: int) -> Entry | None:
        pending: list[Any] = []
        pending_pos: Position = BEFORE_EARLIEST
        pending_size = 0
        while True:
            msg = self._next(timeout_ms)
            if msg is None:
                return None
            mid = msg.message_id()
            pos = (mid.ledger_id(), mid.entry_id())
            if pos <= self.after:
                self.stats.duplicates += 1
                continue
            if pos > self.end:
                return Entry(self.topic, pos[0], pos[1], msg.publish_timestamp(), 1, b"")
            batch_index = mid.batch_index()
            if pending and pos != pending_pos:
                raise Resync(f"batched entry {pending_pos[0]}:{pending_pos[1]} arrived incomplete")
            if not pending:
                if batch_index < 0:
                    return self._handed_over(pos, [msg], batched=False)
                if batch_index != 0:
                    raise Resync(f"entry {pos[0]}:{pos[1]} started at batch index {batch_index}")
                pending_size = batch_size_of(mid.serialize())
                if pending_size <= 0:
                    raise ReaderUnusable(
                        f"{self.topic}: message {pos[0]}:{pos[1]}:{batch_index} is batched but its id "
                        "carries no batch size; this pulsar-client is too old to regroup batches"
                    )
                pending_pos = pos
            elif batch_index < len(pending):
                self.stats.duplicates += 1
                continue
            elif batch_index > len(pending):
                raise Resync(f"entry {pos[0]}:{pos[1]} skipped batch index {len(pending)}")
            pending.append(msg)
            if len(pending) == pending_size:
                return self._handed_over(pos, pending, batched=True)

    def _handed_over(self, pos: Position, msgs: list[Any], batched: bool) -> Entry:
        self.after = pos
        return _build(self.topic, pos, msgs, batched)

    def close(self) -> None:
        self.reader.close()


def read_range(
    client: Any,
    topic: str,
    start: Position,
    end: Position,
    *,
    settings: ReaderSettings | None = None,
    end_is_known: bool = True,
    stats: ReadStats | None = None,
) -> Iterator[Entry]:
    """The complete entries of ``topic`` with positions in ``(start, end]``, in order, once each,
    read with ``pulsar-client`` and rebuilt: :func:`streamoffload.streaming.ranges.read_exactly_once`
    (which has the contract, ``end_is_known`` included) over :class:`_ClientEntries`."""
    settings = settings or ReaderSettings()
    stats = stats if stats is not None else ReadStats()
    end = (int(end[0]), int(end[1]))

    def open_consumer(after: Position) -> _ClientEntries:
        return _ClientEntries(client, topic, after, end, settings, stats)

    # The C++ client's re-subscription is cheap and its stalls short: start every wait afresh.
    return read_exactly_once(open_consumer, topic, start, end, settings=settings, end_is_known=end_is_known,
                             stats=stats, reset_stall_timeout=True)

@dataclass(frozen=True)
class Probe:
    """The first entry after a position: where it is and roughly how big (for byte limits)."""

    position: Position
    num_messages: int
    approx_bytes: int


def probe_after(
    client: Any,
    topic: str,
    after: Position,
    *,
    settings: ReaderSettings | None = None,
    attempts: int = 3,
) -> Probe | None:
    """The first entry after ``after``, or ``None`` if none arrives in ``attempts`` reader openings.

    Reads one message only: for a batched entry the size is estimated from its first message.
    """
    import pulsar

    settings = settings or ReaderSettings()
    timeout = max(settings.stall_timeout_ms, 500)
    for _ in range(attempts):
        try:
            reader = _open_reader(client, topic, after, settings)
        except Exception as err:
            log.warning("%s: probe after %s could not open a reader: %s", topic, after, err)
            time.sleep(settings.initial_backoff_s)
            continue
        try:
            while True:
                try:
                    msg = reader.read_next(timeout)
                except pulsar.Timeout:
                    break
                mid = msg.message_id()
                pos = (mid.ledger_id(), mid.entry_id())
                if pos <= after:
                    continue
                count = batch_size_of(mid.serialize()) if mid.batch_index() >= 0 else 1
                per_message = len(msg.data()) + 64  # + metadata, roughly
                return Probe(pos, max(count, 1), per_message * max(count, 1))
        except Exception as err:
            log.warning("%s: probe after %s failed: %s", topic, after, err)
        finally:
            with contextlib.suppress(Exception):
                reader.close()
        timeout = min(timeout * 2, settings.max_stall_timeout_ms)
    return None
