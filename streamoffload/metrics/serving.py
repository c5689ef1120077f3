"""Serving the metrics: ``/metrics`` over HTTP (prometheus-client's server) on a ``host:port``."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry

from streamoffload.config import parse_metrics_address

log = logging.getLogger(__name__)


class MetricsServer:
    """``/metrics`` of one registry on ``host:port`` (port 0: a free port), in a daemon thread."""

    def __init__(self, registry: CollectorRegistry, address: str) -> None:
        from prometheus_client import start_http_server

        host, port = parse_metrics_address(address)
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


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
