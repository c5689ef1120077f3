"""The embedded Pulsar broker: a ``pulsar-lite`` process managed by the project.

``pulsar-lite`` (PyPI) ships a Pulsar-protocol broker binary (Rust, RocksDB storage) that the
official ``pulsar-client`` talks to. :class:`EmbeddedBroker` starts it on a loopback port with its
own data directory and TOML config, waits until it answers a Pulsar ``CONNECT`` handshake, stops
it (SIGTERM to its process group, then SIGKILL), and restarts it on the same port and data so
clients reconnect to the same address and see the same topics.

Layout of a broker's data directory::

    <data_dir>/pulsar-lite.toml   config written at every start
    <data_dir>/pulsar-lite.log    the broker's stdout and stderr, appended across restarts
    <data_dir>/db/                RocksDB data (``db_path``)

Known behaviour of pulsar-lite (SPEC 6): it rolls a topic's ledger every 50,000 entries and on
every restart; readers see duplicated entries and can stall with data still due (the source copes);
its partitioned topics are only usable through the base topic, so tests keep ``default_partitions =
0`` and publish to explicitly named ``t-partition-N`` plain topics.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from streamoffload.errors import StreamOffloadError
from streamoffload.pulsar.broker_connection import pulsar_handshake
from streamoffload.redaction import private_opener

__all__ = [
    "BrokerError",
    "BrokerProcess",
    "EmbeddedBroker",
    "file_tail",
    "find_binary",
    "free_port",
    "kill_group",
    "pulsar_handshake",
    "stop_group",
]

BINARY_NAME = "pulsar-lite"
CONFIG_NAME = "pulsar-lite.toml"
LOG_NAME = "pulsar-lite.log"
DB_NAME = "db"


class BrokerError(StreamOffloadError):
    """The embedded broker could not be found, started, reached or stopped."""


def find_binary() -> str:
    """Path of the ``pulsar-lite`` executable.

    Looked for, in order: ``$PULSAR_LITE_BINARY``; next to the running Python (a venv's ``bin``);
    on ``PATH``; inside the installed ``pulsar_lite`` package (``pulsar_lite/bin/pulsar-lite``, where
    the PyPI wheel puts it).
    """
    candidates: list[Path] = []
    env = os.environ.get("PULSAR_LITE_BINARY")
    if env:
        candidates.append(Path(env))
    candidates.append(Path(sys.executable).parent / BINARY_NAME)
    on_path = shutil.which(BINARY_NAME)
    if on_path:
        candidates.append(Path(on_path))
    spec = importlib.util.find_spec("pulsar_lite")
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(Path(location) / "bin" / BINARY_NAME)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise BrokerError(
        f"cannot find the {BINARY_NAME} executable (looked at: {', '.join(str(c) for c in candidates)}); "
        "it comes with the demo extra: `pip install 'streamoffload[demo]'` (or `pip install pulsar-lite`), "
        "or set PULSAR_LITE_BINARY"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class BrokerProcess:
    """What the broker processes the project runs share (:class:`EmbeddedBroker`, and
    ``streamoffload.pulsar_standalone.PulsarStandalone``): a Pulsar binary protocol port on ``host``, a data
    directory holding the configuration written at every start (``config_name``) and the log appended across
    restarts (``log_name``), a process leading its own process group, a start that waits until it serves and picks
    other ports when one we picked was taken meanwhile, stop (SIGTERM, then SIGKILL after ``stop_timeout``
    seconds), kill, restart, and a data directory removed by :meth:`close` when it was a temporary one. Subclasses
    set the class attributes below, and ``data_dir``, ``_owns_dir``, ``host``, ``port``, ``_fixed_ports`` and
    ``start_timeout``, and implement :meth:`_spawn`, :meth:`_serving` and :meth:`_pick_ports`."""

    stop_timeout: float = 10.0
    start_timeout: float
    product: str
    """What the log and the errors call the broker."""
    serving_means: str
    """What "serving" is, as the error of a start that timed out says it: "<product> did not <serving_means> ..."."""
    poll_s: tuple[float, float, float]
    """How :meth:`_spawn_and_wait` polls :meth:`_serving`: first pause, growth factor, longest pause (seconds)."""
    config_name: str
    log_name: str
    data_dir: Path
    host: str
    port: int
    _owns_dir: bool
    _fixed_ports: bool
    """A port was given: never pick another."""
    _process: subprocess.Popen[bytes] | None = None
    started_in_s: float | None = None
    """Seconds the last :meth:`start` took, from spawning the process to serving."""

    @property
    def service_url(self) -> str:
        return f"pulsar://{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / self.config_name

    @property
    def log_path(self) -> Path:
        return self.data_dir / self.log_name

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the broker's log ('' when there is none yet)."""
        return file_tail(self.log_path, lines)

    def start(self) -> Self:
        """Start the broker and wait until it serves (:meth:`_spawn_and_wait`). Idempotent when running. When a
        port we picked was taken between picking and binding (the log says so), pick others and try again, twice
        at most."""
        if self.is_running:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        attempts = 3 if self._may_pick_ports() else 1
        for attempt in range(attempts):
            logged = _file_size(self.log_path)
            try:
                self._spawn_and_wait()
                return self
            except BrokerError:
                if attempt + 1 >= attempts or not _port_taken(self.log_path, logged):
                    raise
                self._pick_ports()
        return self  # unreachable: the loop returns or raises

    def _may_pick_ports(self) -> bool:
        """Whether :meth:`start` may move to other ports: only ones we picked ourselves."""
        return not self._fixed_ports

    def _pick_ports(self) -> None:
        """Free ports in place of the ones taken (and undo whatever the failed start recorded about them)."""
        raise NotImplementedError

    def _spawn_and_wait(self) -> None:
        """Start the process (:meth:`_spawn`) and poll until it serves (:meth:`_serving`); ``BrokerError``, with
        the log's tail, when it exits first or is not serving within ``start_timeout`` seconds (it is then
        stopped)."""
        began = time.monotonic()
        process = self._process = self._spawn()
        deadline = began + self.start_timeout
        delay, growth, longest = self.poll_s
        while True:
            code = process.poll()
            if code is not None:
                self._process = None
                raise BrokerError(
                    f"{self.product} exited with code {code} before serving on {self.service_url} "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if self._serving():
                self.started_in_s = time.monotonic() - began
                return
            if time.monotonic() >= deadline:
                self._terminate(self.stop_timeout)
                raise BrokerError(
                    f"{self.product} did not {self.serving_means} on {self.service_url} within "
                    f"{self.start_timeout:g} s (log {self.log_path}):\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * growth, longest)

    def _spawn(self) -> subprocess.Popen[bytes]:
        """Write the configuration and start the process, leading its own process group (``stop`` signals the
        group; a Ctrl-C in a terminal running ``streamoffload broker`` is ours, not delivered twice), its output
        appended to the log."""
        raise NotImplementedError

    def _serving(self) -> bool:
        raise NotImplementedError

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker: SIGTERM to its process group, SIGKILL after ``timeout`` seconds (default
        ``stop_timeout``)."""
        self._terminate(self.stop_timeout if timeout is None else timeout)

    def _terminate(self, timeout: float) -> None:
        process = self._process
        if process is None:
            return
        try:
            stop_group(process, timeout)
        finally:
            self._process = None

    def kill(self) -> None:
        """Kill the broker at once (SIGKILL), as a crash would."""
        process = self._process
        if process is None:
            return
        kill_group(process)
        self._process = None

    def restart(self, timeout: float | None = None) -> None:
        """Stop and start again on the same port(s) with the same data."""
        self.stop(timeout)
        self.start()

    def close(self) -> None:
        """Stop the broker and remove its data directory when it was a temporary one."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EmbeddedBroker(BrokerProcess):
    """A ``pulsar-lite`` broker process on ``127.0.0.1:port``.

    ``data_dir`` defaults to a fresh temporary directory, removed by :meth:`close` (and on leaving
    the ``with`` block); a given ``data_dir`` is kept. ``port`` defaults to a free port, chosen once
    and kept across restarts. ``metrics_port`` turns on pulsar-lite's Prometheus endpoint on
    ``127.0.0.1:metrics_port``; by default it is off (pulsar-lite would otherwise bind 0.0.0.0:8080).
    ``log_level`` defaults to ``warn``: at ``info`` pulsar-lite logs several lines for every entry it
    dispatches and every acknowledgement, gigabytes an hour at a few thousand messages a second.
    """

    product = "pulsar-lite"
    serving_means = "answer a Pulsar handshake"
    poll_s = (0.02, 2.0, 0.25)
    config_name = CONFIG_NAME
    log_name = LOG_NAME

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        default_partitions: int = 0,
        metrics_port: int | None = None,
        binary: str | None = None,
        log_level: str = "warn",
        start_timeout: float = 30.0,
        keep_alive_s: int | None = None,
    ) -> None:
        if default_partitions < 0:
            raise BrokerError(f"default_partitions must be >= 0, got {default_partitions}")
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="pulsar-lite-"))
        self.host = "127.0.0.1"
        self._fixed_ports = port is not None
        self.port = port if port is not None else free_port(self.host)
        self.default_partitions = default_partitions
        self.metrics_port = metrics_port
        self.binary = binary or find_binary()
        self.log_level = log_level
        self.start_timeout = start_timeout
        self.keep_alive_s = keep_alive_s
        """pulsar-lite's PING interval and the time it waits for the PONG before closing a connection (its
        ``keep_alive_interval_secs`` and ``connection_liveness_check_timeout_secs``; None: its defaults)."""
        self._process = None

    # --- paths -----------------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.data_dir / DB_NAME

    def config_text(self) -> str:
        """The TOML pulsar-lite reads (unknown keys are ignored by it, so only known ones are written)."""
        lines = [
            f"db_path = {_toml_string(str(self.db_path))}",
            f"default_partitions = {int(self.default_partitions)}",
        ]
        if self.keep_alive_s is not None:
            lines += [
                f"keep_alive_interval_secs = {int(self.keep_alive_s)}",
                f"connection_liveness_check_timeout_secs = {int(self.keep_alive_s)}",
            ]
        lines += ["", "[metrics]"]
        if self.metrics_port is None:
            lines.append("enabled = false")
        else:
            lines += ["enabled = true", f"addr = {_toml_string(f'{self.host}:{self.metrics_port}')}"]
        return "\n".join(lines) + "\n"

    # --- lifecycle -------------------------------------------------------------------------

    def _pick_ports(self) -> None:
        self.port = free_port(self.host)

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.config_path.write_text(self.config_text(), encoding="utf-8")
        with open(self.log_path, "ab", opener=private_opener) as log:
            log.write(f"\n--- streamoffload: starting {self.binary} on {self.host}:{self.port} ---\n".encode())
            log.flush()
            return subprocess.Popen(
                [
                    self.binary,
                    "--config",
                    str(self.config_path),
                    "--addr",
                    f"{self.host}:{self.port}",
                    "--log-level",
                    self.log_level,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.data_dir),
                start_new_session=True,
            )

    def _serving(self) -> bool:
        return pulsar_handshake(self.host, self.port, timeout=1.0)

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running else "stopped"
        return f"EmbeddedBroker({self.service_url}, data_dir={str(self.data_dir)!r}, {state})"


def file_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of the text file at ``path`` (its last 64 KiB at most; '' when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


PORT_TAKEN = ("Address already in use", "AddrInUse")
"""How a broker's log says a port was taken: the JVM's ``BindException`` and Rust's ``io::ErrorKind``."""


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _port_taken(log_path: Path, since: int) -> bool:
    """Whether the log says, after its first ``since`` bytes (what earlier starts wrote), that a port was taken
    (in the last 4 MiB of what this start wrote: a failed start ends with why)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(max(since, fh.seek(0, os.SEEK_END) - 4 * 1024 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return False
    return any(marker in text for marker in PORT_TAKEN)


def stop_group(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process group ``process`` leads (started with ``start_new_session``), SIGKILL after
    ``timeout`` seconds; returns once the process is reaped."""
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process group ``process`` leads, as a crash would; returns once it is reaped."""
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)  # pid == pgid: the process leads its own session


def _toml_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
