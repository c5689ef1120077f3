"""The process-wide machinery ``S3Store`` calls through: ONE background event-loop thread and ONE aiobotocore
client (with its connection pool) per distinct configuration, shared by every ``S3Store`` of that configuration
and safe to call from several threads at once. A forked child (Spark's Python workers are forked) gets a fresh
loop and fresh clients: sockets are never shared across processes. Everything is closed at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import botocore.handlers
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession

from streamoffload.redaction import register_secret

T = TypeVar("T")


@dataclass(frozen=True)
class ClientConfig:
    endpoint_url: str | None
    region: str | None
    path_style: bool
    profile: str | None
    connect_timeout: float
    read_timeout: float
    max_pool_connections: int
    checksums: str
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)


class Runtime:
    """The event loop thread and the clients of one process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run_loop, name="streamoffload-s3", daemon=True)
        self.clients: dict[ClientConfig, Any] = {}
        self.stacks: list[contextlib.AsyncExitStack] = []
        self.create_lock = asyncio.Lock()
        self.thread.start()

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("S3Store's synchronous API was called from its own event loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def client(self, cfg: ClientConfig) -> Any:
        client = self.clients.get(cfg)
        if client is not None:
            return client
        async with self.create_lock:
            client = self.clients.get(cfg)
            if client is None:
                session = AioSession(profile=cfg.profile)
                config = AioConfig(
                    signature_version="s3v4",
                    s3={"addressing_style": "path" if cfg.path_style else "auto"},
                    retries={"total_max_attempts": 1, "mode": "standard"},  # S3Store retries itself
                    connect_timeout=cfg.connect_timeout,
                    read_timeout=cfg.read_timeout,
                    max_pool_connections=cfg.max_pool_connections,
                    request_checksum_calculation=cfg.checksums,
                    response_checksum_validation=cfg.checksums,
                )
                stack = contextlib.AsyncExitStack()
                created: Any = await stack.enter_async_context(
                    session.create_client(
                        "s3",
                        region_name=cfg.region,
                        endpoint_url=cfg.endpoint_url,
                        aws_access_key_id=cfg.access_key,
                        aws_secret_access_key=cfg.secret_key,
                        aws_session_token=cfg.session_token,
                        config=config,
                    )
                )
                # botocore asks for "Expect: 100-continue" on uploads and aiohttp then waits for the
                # "100 Continue" with no timeout at all: a black-holed endpoint would hang us forever.
                created.meta.events.unregister("before-call.s3", botocore.handlers.add_expect_header)
                if cfg.access_key is None:
                    await _register_chain_credentials(session)
                self.stacks.append(stack)
                self.clients[cfg] = client = created
        return client

    async def _close_clients(self) -> None:
        for stack in self.stacks:
            with contextlib.suppress(Exception):
                await stack.aclose()
        self.stacks.clear()
        self.clients.clear()

    def shutdown(self, timeout: float = 5.0) -> None:
        if self.pid != os.getpid() or not self.thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close_clients(), self.loop).result(timeout)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout)


async def _register_chain_credentials(session: AioSession) -> None:
    """Have ``redaction.redact`` mask the credentials the AWS chain gave the client (the environment, a profile,
    an instance role), as ``S3Store`` does with credentials it is given. Credentials a role refreshes later are
    masked where the redaction's patterns find them (request headers, access key ids)."""
    try:
        credentials = await session.get_credentials()  # the ones create_client resolved: cached by the session
        if credentials is not None:
            frozen = await credentials.get_frozen_credentials()
            register_secret(frozen.access_key, frozen.secret_key, frozen.token)
    except Exception:  # none found, or a provider failed: the client reports it at its first call
        return


_runtime: Runtime | None = None
_runtime_lock = threading.Lock()


def get_runtime() -> Runtime:
    global _runtime
    runtime = _runtime
    if runtime is not None and runtime.pid == os.getpid():
        return runtime
    with _runtime_lock:
        if _runtime is None or _runtime.pid != os.getpid():
            # In a forked child the parent's loop thread does not exist and its sockets are the
            # parent's: start over without touching them.
            _runtime = Runtime()
        return _runtime


def _after_fork_in_child() -> None:
    global _runtime, _runtime_lock
    _runtime = None
    _runtime_lock = threading.Lock()  # the parent's may have been held by another thread at fork time


os.register_at_fork(after_in_child=_after_fork_in_child)


def shutdown() -> None:
    """Close every S3 client of this process and stop the loop thread (also run at exit)."""
    global _runtime
    with _runtime_lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.shutdown()


atexit.register(shutdown)
