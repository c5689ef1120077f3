"""One connection to a Pulsar broker over the binary protocol, shared by the raw-entry reader
(``streamoffload/pulsar/raw_reader.py``: lookups, subscriptions, entries) and the driver's topic listing
(:func:`list_topics`) and readiness check (:func:`pulsar_handshake`). Frames are ``streamoffload/pulsar/wire.py``'s.

Steps (field numbers in ``codecs/proto/pulsar_api.proto``): ``CONNECT`` (protocol version 19, auth method
and data, feature flags) -> ``CONNECTED`` (``AUTH_CHALLENGE`` answered with the same credentials);
``PING`` is answered with ``PONG`` on the way; a request waits for the answer that carries its request id.
``pulsar+ssl://`` is TLS with the :class:`~streamoffload.pulsar.client_options.ConnectionConfig` trust
and client-certificate settings. TLS failures that configuration causes are not retried: a server
certificate the trust settings do not accept, or a server that requires a client certificate the options
do not give, raise :class:`~streamoffload.pulsar.exactly_once.ReaderUnusable` naming the address and option;
unreadable certificate, key or trust files raise :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import select
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence

from google.protobuf.message import DecodeError

from streamoffload.codecs.proto.pulsar_api_pb2 import (
    BaseCommand,
    CommandGetTopicsOfNamespace,
    CommandLookupTopicResponse,
    ServerError,
)
from streamoffload.codecs.protobuf import from_buffer
from streamoffload.errors import ConfigError
from streamoffload.pulsar.client_options import (
    CLIENT_OPTION_PREFIX,
    ConnectionConfig,
    ServiceAddress,
    normalized,
    token_from_options,
)
from streamoffload.pulsar.exactly_once import PulsarIOError, ReaderUnusable, TopicNotFoundError
from streamoffload.pulsar.wire import FRAME_HEADER, MAX_FRAME, T, frame, request_id_of, server_error
from streamoffload.redaction import redact

PROTOCOL_VERSION = 19  # v18 is the first that may receive broker entry metadata
CLIENT_VERSION = "streamoffload-raw-reader"
_RECV_CHUNK = 1 << 18
_PUSHED = frozenset((T.MESSAGE, T.CLOSE_CONSUMER, T.REACHED_END_OF_TOPIC))
_parse_command = from_buffer(BaseCommand)  # a frame's command, parsed from the receive buffer without a copy
"""Frames a broker sends a consumer unasked: ``BrokerConnection.on_push`` takes them."""
_POLL_S = 0.001
"""``BrokerConnection.poll``: how long one look at the socket waits for more."""
_DIRECT_PAYLOAD = 1 << 15
"""A frame's payload at least this long is received straight into its own buffer (one copy, the kernel's),
not appended to the connection's buffer, compacted and copied out again (three more, of every entry byte)."""


class NoAnswerError(PulsarIOError):
    """The broker did not answer a request (``CONNECT`` included) within the operation timeout."""


class TopicListingUnsupported(PulsarIOError):
    """The broker does not answer ``GetTopicsOfNamespace`` (pulsar-lite 0.2 ignores the command)."""


def refusal(cmd: BaseCommand, what: str, where: str) -> PulsarIOError:
    """The error an ``ERROR`` answer to ``what`` stands for: :class:`TopicNotFoundError` for ``TopicNotFound``."""
    return _server_refusal(cmd.error.error, f"{what} failed at {where}: {cmd.error.message}")


def lookup_refusal(resp: CommandLookupTopicResponse, topic: str, where: str) -> PulsarIOError:
    """The error a failed lookup of ``topic`` stands for (:class:`TopicNotFoundError` for ``TopicNotFound``)."""
    return _server_refusal(resp.error, f"lookup of {topic} at {where} failed: {resp.message or 'no reason given'}")


def _server_refusal(code: int, message: str) -> PulsarIOError:
    kind = TopicNotFoundError if code == ServerError.TopicNotFound else PulsarIOError
    return kind(f"{message} ({server_error(code)})")


class BrokerConnection:
    """One TCP (or TLS) connection that has completed the CONNECT handshake."""

    def __init__(
        self, config: ConnectionConfig, address: ServiceAddress, proxy_to_broker_url: str | None = None
    ) -> None:
        self.config = config
        self.address = address
        self.proxy_to = proxy_to_broker_url
        self.name = f"{address.host}:{address.port}"
        self._buf = bytearray()
        self._pos = 0
        self._chunk = bytearray(_RECV_CHUNK)
        self._partial: tuple[BaseCommand, bytearray, int] | None = None
        """A large frame being received: its command, its payload buffer and how much of it has arrived."""
        self._request_id = 0
        self.on_push: Callable[[BaseCommand], None] | None = None
        """Where MESSAGE, CLOSE_CONSUMER and REACHED_END_OF_TOPIC frames go when set (a watcher of consumers
        with permits: ``latest_positions.HeldPositions``), instead of to the reader of the connection."""
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
                    raise NoAnswerError(f"{self.name}: no answer to CONNECT within {config.operation_timeout_s:g} s")
                cmd, _payload = got
                if cmd.type == T.CONNECTED:
                    self.server_version = cmd.connected.server_version
                    break
                if cmd.type == T.ERROR:
                    raise PulsarIOError(
                        f"{self.name} refused the connection: {cmd.error.message} ({server_error(cmd.error.error)})"
                    )
        except BaseException:
            with contextlib.suppress(OSError):
                sock.close()
            raise

    def _connect_step(
        self, connect: BaseCommand | None, deadline: float
    ) -> tuple[BaseCommand, bytes | bytearray | None] | None:
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
        how = (
            f"{CLIENT_OPTION_PREFIX}authPluginClassName=AuthenticationTls with "
            f"{CLIENT_OPTION_PREFIX}authParams=tlsCertFile:...,tlsKeyFile:..."
        )
        if "CERTIFICATE_REQUIRED" in reason:
            # Configuration, not a passing fault: retrying would only delay the same refusal.
            return ReaderUnusable(
                f"TLS: {self.name} refused the connection: {reason}; the server requires a client certificate ({how})"
            )
        if not self.config.tls_cert_file:
            # The refusal may reach us as a bare close (the alert lost to a reset): a hint, and retried.
            return PulsarIOError(
                f"TLS: {self.name} refused the connection: {reason}; "
                f"if the server requires a client certificate, give one ({how})"
            )
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
            trust = (
                f"tlsTrustCertsFilePath={cfg.tls_trust_certs_file}"
                if cfg.tls_trust_certs_file
                else "system trust store"
            )
            # A server the configuration does not trust stays untrusted: fail now, not after the retry budget.
            raise ReaderUnusable(f"TLS: the certificate of {self.name} is not trusted ({trust}): {err}") from err
        except ssl.SSLError as err:
            raise self._tls_refused(err) from err

    def next_request_id(self) -> int:
        self._request_id += 1
        return self._request_id

    def send(self, command: BaseCommand) -> None:
        self.sock.sendall(frame(command))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, deadline: float) -> tuple[BaseCommand, bytes | bytearray | None] | None:
        """The next command and its payload (a MESSAGE's entry bytes), or None at ``deadline``.

        PING is answered and AUTH_CHALLENGE re-sends the credentials on the way. A partial frame at
        the deadline stays buffered, so a later call continues where this one stopped."""
        while True:
            got = self._nextframe()
            if got is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.sock.settimeout(remaining)
                try:
                    self._receive()
                except TimeoutError:
                    return None
                continue
            cmd, payload = got
            if cmd.type == T.PING:
                self.send(BaseCommand(type=T.PONG, pong={}))
                continue
            if cmd.type == T.AUTH_CHALLENGE:
                self._answer_challenge(cmd)
                continue
            if self.on_push is not None and cmd.type in _PUSHED:
                self.on_push(cmd)
                continue
            return cmd, payload

    def poll(self) -> None:
        """Take in what has arrived, without waiting: pushed frames go to ``on_push``; anything else (a late
        answer to a request given up on) is dropped. Raises when the connection failed."""
        while self.read(time.monotonic() + _POLL_S) is not None:
            pass

    def take_in_now(self) -> None:
        """What has already arrived, taken in without waiting at all (``poll`` waits a millisecond for more): the
        check of a kept connection before a consumer reuses it, once per range a task reads. Frames are handled
        as ``poll`` handles them; raises when the broker closed the connection."""
        while True:
            while self.read(time.monotonic()) is not None:  # whole frames already buffered (a past deadline: no recv)
                pass
            readable, _, _ = select.select([self.sock], [], [], 0)
            if not readable:
                return
            try:
                self._receive()  # something came, or the broker's close (ConnectionError)
            except (TimeoutError, ssl.SSLWantReadError):
                return  # part of a TLS record: the next reader takes in the rest

    def _receive(self) -> None:
        """One ``recv``: into the large frame being received, else into the connection's buffer."""
        partial = self._partial
        if partial is not None:
            cmd, payload, filled = partial
            with memoryview(payload) as mv:
                n = self.sock.recv_into(mv[filled:])
            self._partial = (cmd, payload, filled + n)
        else:
            n = self.sock.recv_into(self._chunk)
            if n:
                if self._pos and self._pos * 2 >= len(self._buf):
                    del self._buf[: self._pos]
                    self._pos = 0
                self._buf += memoryview(self._chunk)[:n]
        if n == 0:
            raise ConnectionError(f"{self.name} closed the connection")

    def _nextframe(self) -> tuple[BaseCommand, bytes | bytearray | None] | None:
        """The next whole frame's command and payload (a large payload as the ``bytearray`` it was received
        into), or None until more has arrived."""
        partial = self._partial
        if partial is not None:
            cmd, large, filled = partial
            if filled < len(large):
                return None
            self._partial = None
            return cmd, large
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            return None
        total, cmd_size = FRAME_HEADER.unpack_from(buf, pos)
        if cmd_size + 4 > total or total > MAX_FRAME:
            raise PulsarIOError(f"bad frame from {self.name}: total size {total}, command size {cmd_size}")
        end = pos + 4 + total
        cmd_end = pos + 8 + cmd_size
        if len(buf) < end:
            if end - cmd_end < _DIRECT_PAYLOAD or len(buf) < cmd_end:
                return None
            # A large payload (an entry): the rest of it goes straight into its own buffer.
            with memoryview(buf) as mv:
                cmd = _parse_command(mv[pos + 8 : cmd_end])
                large = bytearray(end - cmd_end)
                have = len(buf) - cmd_end
                large[:have] = mv[cmd_end:]
            del buf[:]
            self._pos = 0
            self._partial = (cmd, large, have)
            return None
        with memoryview(buf) as mv:
            cmd = _parse_command(mv[pos + 8 : cmd_end])
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

    def request(
        self, command: BaseCommand, request_id: int, what: str, *, timeout_s: float | None = None
    ) -> BaseCommand:
        """Send ``command`` and wait for the answer that carries ``request_id`` (other frames are skipped), at
        most ``timeout_s`` (default: the operation timeout)."""
        self.send(command)
        wait = self.config.operation_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + wait
        while True:
            got = self.read(deadline)
            if got is None:
                raise NoAnswerError(f"{self.name}: no answer to {what} within {wait:g} s")
            cmd, _payload = got
            answer = request_id_of(cmd)
            if answer == request_id:
                if cmd.type == T.ERROR:
                    raise refusal(cmd, what, self.name)
                return cmd

    def request_many(
        self,
        requests: Sequence[tuple[BaseCommand, int, str]],
        *,
        window: int = 256,
        timeout_s: float | None = None,
    ) -> dict[int, BaseCommand | PulsarIOError]:
        """Pipelined requests: ``(command, request_id, what)`` sent with up to ``window`` awaiting an answer,
        and the answers by request id. An ``ERROR`` answer is that request's ``PulsarIOError``, not raised,
        so one topic's refusal does not cost the others theirs. Raises ``NoAnswerError`` when no answer
        comes for ``timeout_s`` (default: the operation timeout)."""
        wait = self.config.operation_timeout_s if timeout_s is None else timeout_s
        answers: dict[int, BaseCommand | PulsarIOError] = {}
        waiting: dict[int, str] = {}
        pending = list(requests)
        pending.reverse()
        while pending or waiting:
            while pending and len(waiting) < window:
                command, request_id, what = pending.pop()
                self.send(command)
                waiting[request_id] = what
            got = self.read(time.monotonic() + wait)
            if got is None:
                raise NoAnswerError(
                    f"{self.name}: no answer to {len(waiting)} requests (e.g. {next(iter(waiting.values()))}) "
                    f"within {wait:g} s"
                )
            cmd, _payload = got
            answered = request_id_of(cmd)
            if answered is None or answered not in waiting:
                continue
            what = waiting.pop(answered)
            if cmd.type == T.ERROR:
                answers[answered] = refusal(cmd, what, self.name)
            else:
                answers[answered] = cmd
        return answers

    def lookup(self, topic: str, authoritative: bool) -> CommandLookupTopicResponse:
        rid = self.next_request_id()
        cmd = BaseCommand(type=T.LOOKUP)
        cmd.lookupTopic.topic = topic
        cmd.lookupTopic.request_id = rid
        cmd.lookupTopic.authoritative = authoritative
        return self.request(cmd, rid, f"lookup of {topic}").lookupTopicResponse

    def topics_of_namespace(self, namespace: str) -> list[str]:
        """The persistent topics of ``tenant/namespace``; partitioned topics are listed by their
        partitions, as Pulsar's broker does."""
        rid = self.next_request_id()
        cmd = BaseCommand(type=T.GET_TOPICS_OF_NAMESPACE)
        cmd.getTopicsOfNamespace.request_id = rid
        cmd.getTopicsOfNamespace.namespace = namespace
        cmd.getTopicsOfNamespace.mode = CommandGetTopicsOfNamespace.PERSISTENT
        answer = self.request(cmd, rid, "GetTopicsOfNamespace")
        return list(answer.getTopicsOfNamespaceResponse.topics)


def pulsar_handshake(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when ``host:port`` answers a Pulsar ``CONNECT`` with ``CONNECTED``."""
    address = ServiceAddress(host, port, False)
    config = ConnectionConfig(service=address, connect_timeout_s=timeout, operation_timeout_s=timeout)
    try:
        with BrokerConnection(config, address):
            return True
    except (OSError, ValueError, DecodeError, PulsarIOError):
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
    opts = {k: v for k, (_orig, v) in normalized(client_options or {}).items()}
    plugin = opts.get("authpluginclassname", "")
    if plugin and token_from_options(client_options or {}) is None:
        raise PulsarIOError(
            f"topic discovery (topicsPattern) supports no authentication or token authentication, not {plugin}; "
            "list the topics with the 'topics' option instead"
        )
    config = dataclasses.replace(
        ConnectionConfig.parse(service_url, client_options), connect_timeout_s=timeout, operation_timeout_s=timeout
    )
    try:
        with BrokerConnection(config, config.service) as conn:
            return conn.topics_of_namespace(namespace)
    except (TimeoutError, NoAnswerError) as err:
        raise TopicListingUnsupported(
            f"cannot list topics of {namespace!r} at {redact(service_url)}: no answer to GetTopicsOfNamespace within "
            f"{timeout:g} s (pulsar-lite ignores this command; give the topics or topicsPatternCandidates)"
        ) from err
    except (OSError, ValueError, DecodeError) as err:
        raise PulsarIOError(redact(f"cannot list topics of {namespace!r} at {service_url}: {err}")) from err


__all__ = [
    "CLIENT_VERSION",
    "PROTOCOL_VERSION",
    "BrokerConnection",
    "NoAnswerError",
    "TopicListingUnsupported",
    "list_topics",
    "pulsar_handshake",
]
