"""A fault-injecting HTTP proxy for S3, on loopback, in front of a local S3 endpoint (moto_server).

The chaos bench (bench/chaos.py) points the job's ``serviceEndpoint`` at the proxy and switches faults on
and off while the job runs. Faults are applied per request, to a ``share`` of the requests (1.0: all):

- ``500``: ``500 InternalError`` with S3's XML error body; the request never reaches the store;
- ``503``: ``503 SlowDown`` (S3's throttling answer), XML body, ``Retry-After``-free like S3's;
- ``reset``: the request is read, then the connection is reset (RST, no answer);
- ``hang``: the request is read and never answered; the connection is reset after ``hang_s`` seconds
  (set it beyond the client's read timeout for a client-side timeout, 60 s for the job's S3 client);
- ``delay``: the store's answer is held for ``delay_s`` seconds before it is sent.

The proxy speaks just enough HTTP/1.1 for an S3 client: keep-alive, ``Content-Length`` and chunked bodies,
``Expect: 100-continue`` (answered by the proxy, so the body comes at once), HEAD answers without a body.
It is an asyncio server on a thread of its own; ``set_fault`` and ``clear`` may be called from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
import threading
import uuid
from collections import Counter
from dataclasses import dataclass

FAULT_KINDS = ("500", "503", "reset", "hang", "delay")
_ERRORS = {
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}


@dataclass(frozen=True)
class Fault:
    kind: str
    share: float = 1.0
    """The fraction of requests that get it (seeded; the rest pass through)."""
    delay_s: float = 3.0
    hang_s: float = 75.0


def s3_error_body(code: str, message: str, resource: str) -> bytes:
    """S3's XML error document, as S3 sends it with an error status."""
    request_id = uuid.uuid4().hex[:16].upper()
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message><Resource>{resource}</Resource>"
        f"<RequestId>{request_id}</RequestId><HostId>s3-fault-proxy</HostId></Error>"
    ).encode()


class _Closed(Exception):
    """The peer closed the connection between requests."""


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, list[tuple[str, str]]]:
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as err:
        if not err.partial:
            raise _Closed from None
        raise
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers.append((name.strip(), value.strip()))
    return lines[0], headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def _read_body(reader: asyncio.StreamReader, headers: list[tuple[str, str]]) -> bytes:
    """A message body framed by Content-Length or chunked (re-framed with Content-Length by the caller)."""
    if (_header(headers, "transfer-encoding") or "").lower() == "chunked":
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers from S3 clients or moto
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    length = int(_header(headers, "content-length") or 0)
    return await reader.readexactly(length) if length else b""


def _render(start: str, headers: list[tuple[str, str]], body: bytes, *, keep_length: bool = False) -> bytes:
    """The message with a Content-Length of its body (chunked framing and Expect removed)."""
    drop = {"transfer-encoding", "expect"} | (set() if keep_length else {"content-length"})
    kept = [(k, v) for k, v in headers if k.lower() not in drop]
    if not keep_length:
        kept.append(("Content-Length", str(len(body))))
    head = start + "\r\n" + "".join(f"{k}: {v}\r\n" for k, v in kept) + "\r\n"
    return head.encode("latin-1") + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a crashed or overloaded front end does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class S3FaultProxy:
    """``with S3FaultProxy(upstream_url) as proxy:`` serves on ``proxy.url``; ``proxy.set_fault(Fault(...))``."""

    def __init__(self, upstream_url: str, *, seed: int = 0, host: str = "127.0.0.1", port: int = 0) -> None:
        rest = upstream_url.split("://", 1)[-1].rstrip("/")
        up_host, _, up_port = rest.partition(":")
        self.upstream = (up_host, int(up_port or 80))
        self._host, self._port = host, port
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._fault: Fault | None = None
        self.injected: Counter[str] = Counter()
        """Requests that got each fault kind."""
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="s3-fault-proxy", daemon=True)
        self._hanging: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        """The connections' tasks: held here, since asyncio keeps only weak references to running tasks."""
        self.url = ""

    # -- control (any thread) ----------------------------------------------------------------------

    def set_fault(self, fault: Fault | None) -> None:
        if fault is not None and fault.kind not in FAULT_KINDS:
            raise ValueError(f"unknown S3 fault {fault.kind!r}; known: {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._fault = fault

    def clear(self) -> None:
        """No more faults; connections held by a ``hang`` are reset now (their clients retry)."""
        self.set_fault(None)
        asyncio.run_coroutine_threadsafe(self._release_hanging(), self._loop).result(10)

    def _pick(self) -> Fault | None:
        with self._lock:
            self.requests += 1
            fault = self._fault
            if fault is None or self._rng.random() >= fault.share:
                return None
            self.injected[fault.kind] += 1
            return fault

    # -- life --------------------------------------------------------------------------------------

    def start(self) -> S3FaultProxy:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._serve, self._host, self._port), self._loop
        ).result(10)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{self._host}:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._shut_down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> S3FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _shut_down(self) -> None:
        """Close the listening socket, then reset held and open connections: on the loop's own thread, since
        ``Server.close`` from another thread raced with a connection ending (asyncio is not thread-safe)."""
        assert self._server is not None
        self._server.close()
        await self._release_hanging()
        await self._cancel_connections()

    async def _cancel_connections(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _release_hanging(self) -> None:
        for writer in list(self._hanging):
            _reset(writer)
        self._hanging.clear()

    # -- one client connection -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            while True:
                start, headers = await _read_head(reader)
                method = start.split(" ", 1)[0].upper()
                if (_header(headers, "expect") or "").lower() == "100-continue":
                    writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    await writer.drain()
                body = await _read_body(reader, headers)
                fault = self._pick()
                if fault is not None and fault.kind in _ERRORS:
                    status, reason, code, message = _ERRORS[fault.kind]
                    resource = start.split(" ")[1] if " " in start else "/"
                    error = s3_error_body(code, message, resource)
                    writer.write(_render(f"HTTP/1.1 {status} {reason}", [("Content-Type", "application/xml")], error))
                    await writer.drain()
                    continue
                if fault is not None and fault.kind == "reset":
                    _reset(writer)
                    return
                if fault is not None and fault.kind == "hang":
                    self._hanging.add(writer)
                    await asyncio.sleep(fault.hang_s)
                    self._hanging.discard(writer)
                    _reset(writer)
                    return
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream)
                up_reader, up_writer = upstream
                up_writer.write(_render(start, headers, body))
                await up_writer.drain()
                status_line, answer_headers = await _read_head(up_reader)
                status = int(status_line.split(" ")[1])
                if method == "HEAD" or status in (204, 304):
                    answer_body, keep = b"", True
                else:
                    answer_body, keep = await _read_body(up_reader, answer_headers), False
                if fault is not None and fault.kind == "delay":
                    await asyncio.sleep(fault.delay_s)
                writer.write(_render(status_line, answer_headers, answer_body, keep_length=keep))
                await writer.drain()
        except (_Closed, asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.CancelledError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            self._hanging.discard(writer)
            if upstream is not None:
                upstream[1].close()
            if not writer.transport.is_closing():
                writer.close()
