"""Serving the metrics: ``/metrics`` over HTTP (prometheus-client's server) on a ``host:port``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from streamoffload.errors import ConfigError

log = logging.getLogger(__name__)


class MetricsServer:
    """``/metrics`` of one registry on ``host:port`` (port 0: a free port), in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, address: str) -> None:
        from prometheus_client import start_http_server

        host, port = parse_address(address)
        self._server: Any
        self._thread: threading.Thread | None
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.address: tuple[str, int] = (host, int(self._server.server_address[1]))
        log.info("Prometheus metrics on http://%s/metrics", format_address(*self.address))

    @property
    def url(self) -> str:
        return f"http://{format_address(*self.address)}/metrics"

    def stop(self) -> None:
        """Close the listening socket and join the thread. Idempotent."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (loopback) into (host, port)."""
    text = address.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or int(port_text) > 65535:
        raise ConfigError(f"metrics address {address!r}: expected host:port, e.g. 127.0.0.1:9464")
    host = host.strip("[]") or "127.0.0.1"
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
