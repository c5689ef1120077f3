"""Apache Pulsar standalone, started by the project: the real broker beside the embedded pulsar-lite.

:class:`PulsarStandalone` runs ``org.apache.pulsar.PulsarStandaloneStarter`` (one JVM: a broker, one bookie
and the RocksDB metadata store, no ZooKeeper) from the jars that ``bash scripts/pulsar.sh fetch`` resolves from
Maven Central into ``.cache/pulsar/<version>/lib`` (``scripts/pulsar/pom.xml``; no Pulsar tarball is needed).
It has :class:`~streamoffload.embedded_broker.EmbeddedBroker`'s surface: ``service_url``, ``start``/``stop``/
``restart``/``kill``, ``log_path``, a context manager; and ``admin_url`` with :meth:`admin`, a small REST
client of the broker's admin API (what ``pulsar-admin`` calls).

Sized for a small machine: no functions worker, no stream storage (``-nfw -nss``), one bookie, a 512 MiB heap,
few threads; the binary protocol, the admin HTTP port and the bookie all listen on 127.0.0.1 only, on ports
chosen once and kept across restarts (the bookie's is also recorded in its cookie, which a restart honours).

Unlike Pulsar's own default, closed ledgers are retained (``defaultRetentionTimeInMinutes = -1``, size -1):
real Pulsar deletes a topic's closed ledgers at once when no subscription holds them and retention is 0, so
without this, what a test publishes before the job reads it would be gone. Namespace and topic retention
policies (through :meth:`admin`) override it, which is how a test makes the broker trim for real.

Layout of a broker's data directory::

    <data_dir>/standalone.conf     broker (and bookie) configuration, written at every start
    <data_dir>/log4j2.properties   logging to stdout, which goes to the log
    <data_dir>/pulsar.log          the JVM's stdout and stderr, appended across restarts
    <data_dir>/metadata/           the RocksDB metadata store
    <data_dir>/bookkeeper/         the bookie's journal and ledgers
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from streamoffload.embedded_broker import BrokerError, BrokerProcess, free_port, pulsar_handshake

__all__ = ["PULSAR_VERSION", "PulsarStandalone", "pulsar_lib_dir"]

PULSAR_VERSION = "4.0.7"
"""The pinned Apache Pulsar release (the 4.0 LTS line); ``scripts/pulsar/pom.xml`` resolves the same."""

CONFIG_NAME = "standalone.conf"
LOG_CONFIG_NAME = "log4j2.properties"
LOG_NAME = "pulsar.log"
STARTER = "org.apache.pulsar.PulsarStandaloneStarter"
CLUSTER = "standalone"

JVM_OPTIONS: tuple[str, ...] = (
    "-Xms64m",
    # One GC thread and no concurrent marking: the machine has 2 cores.
    "-XX:+UseSerialGC",
    # What bin/pulsar opens for Netty's direct buffers and the broker's runtime metrics.
    "--add-opens=java.base/java.nio=ALL-UNNAMED",
    "--add-opens=java.base/sun.nio.ch=ALL-UNNAMED",
    "--add-opens=java.base/java.lang=ALL-UNNAMED",
    "--add-opens=java.base/jdk.internal.platform=ALL-UNNAMED",
    "--add-opens=java.management/sun.management=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.leakDetection.level=disabled",
    "-Djava.net.preferIPv4Stack=true",
)
QUICK_START_OPTIONS: tuple[str, ...] = ("-XX:TieredStopAtLevel=1",)
"""C1 only: the JVM compiles less, so the broker is up in about half the CPU time, dispatching somewhat slower.
For tests; benches that measure dispatch leave it off (``quick_start=False``)."""


def pulsar_lib_dir(version: str = PULSAR_VERSION) -> Path:
    """The directory of Pulsar's jars: ``$STREAMOFFLOAD_PULSAR_LIB``, else ``.cache/pulsar/<version>/lib`` of the
    source tree this module is in (where ``bash scripts/pulsar.sh fetch`` puts them)."""
    env = os.environ.get("STREAMOFFLOAD_PULSAR_LIB")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1] / ".cache" / "pulsar" / version / "lib"


def _check_lib(lib_dir: Path, version: str) -> None:
    broker_jar = lib_dir / f"pulsar-broker-{version}.jar"
    if not broker_jar.is_file():
        raise BrokerError(
            f"Apache Pulsar {version} is not resolved: {broker_jar} does not exist; fetch it from Maven Central "
            f"with `bash scripts/pulsar.sh fetch` (or point STREAMOFFLOAD_PULSAR_LIB at a directory of its jars)"
        )


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise BrokerError("Apache Pulsar needs Java 17 or newer, and no 'java' is on PATH (nor in JAVA_HOME)")
    return found


class PulsarStandalone(BrokerProcess):
    """An Apache Pulsar standalone process on ``127.0.0.1``.

    ``data_dir`` defaults to a fresh temporary directory, removed by :meth:`close` (and on leaving the ``with``
    block); a given one is kept. ``port`` (binary protocol), ``web_port`` (admin HTTP) and ``bookie_port`` default
    to free ports, chosen once and kept across restarts. ``max_entries_per_ledger`` sets
    ``managedLedgerMaxEntriesPerLedger`` (Pulsar's default 50,000) with no minimum rollover time, so a test sees
    ledger rollovers after a few entries. ``config`` adds or overrides ``standalone.conf`` keys (Pulsar's
    names). ``heap`` and ``direct_memory`` are the JVM's ``-Xmx`` and ``-XX:MaxDirectMemorySize``. ``env`` adds
    to the JVM's environment (this process's): e.g. ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` for its own
    offloader, kept out of ``standalone.conf`` and the command line.
    """

    stop_timeout = 60.0  # Pulsar closes its ledgers and the bookie flushes: 5-10 s here
    product = "Apache Pulsar"
    serving_means = "serve"
    poll_s = (0.1, 1.5, 1.0)
    config_name = CONFIG_NAME
    log_name = LOG_NAME

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        web_port: int | None = None,
        bookie_port: int | None = None,
        max_entries_per_ledger: int | None = None,
        config: Mapping[str, str | int | float | bool] | None = None,
        version: str = PULSAR_VERSION,
        lib_dir: str | os.PathLike[str] | None = None,
        heap: str = "512m",
        direct_memory: str = "256m",
        quick_start: bool = True,
        jvm_options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_level: str = "info",
        start_timeout: float = 300.0,
    ) -> None:
        if max_entries_per_ledger is not None and max_entries_per_ledger < 1:
            raise BrokerError(f"max_entries_per_ledger must be >= 1, got {max_entries_per_ledger}")
        self.version = version
        self.lib_dir = Path(lib_dir) if lib_dir is not None else pulsar_lib_dir(version)
        _check_lib(self.lib_dir, version)
        self._owns_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="pulsar-"))
        self.host = "127.0.0.1"
        self._fixed_ports = port is not None or web_port is not None or bookie_port is not None
        self.port = port if port is not None else free_port(self.host)
        self.web_port: int = web_port if web_port is not None else free_port(self.host)
        self.bookie_port: int = bookie_port if bookie_port is not None else free_port(self.host)
        self.max_entries_per_ledger = max_entries_per_ledger
        self.overrides = dict(config or {})
        self.heap = heap
        self.direct_memory = direct_memory
        self.quick_start = quick_start
        self.jvm_options = tuple(jvm_options)
        self.env = dict(env or {})
        self.log_level = log_level
        self.start_timeout = start_timeout
        self._process = None

    # --- addresses -------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.web_port}"

    def config_values(self) -> dict[str, str]:
        """``standalone.conf``'s keys and values. The bookie reads the same file (PulsarStandalone loads it as
        its ``ServerConfiguration`` too), so its settings are here as well."""
        values: dict[str, str | int | float | bool] = {
            "clusterName": CLUSTER,
            "bindAddress": self.host,
            "advertisedAddress": self.host,
            "brokerServicePort": self.port,
            "webServicePort": self.web_port,
            "functionsWorkerEnabled": False,
            "brokerDeleteInactiveTopicsEnabled": False,
            # Keep closed ledgers whether or not a subscription holds them (module docstring).
            "defaultRetentionTimeInMinutes": -1,
            "defaultRetentionSizeInMB": -1,
            "managedLedgerDefaultEnsembleSize": 1,
            "managedLedgerDefaultWriteQuorum": 1,
            "managedLedgerDefaultAckQuorum": 1,
            "managedLedgerCacheSizeMB": 64,
            # Threads for 2 cores.
            "numIOThreads": 2,
            "numOrderedExecutorThreads": 2,
            "numHttpServerThreads": 4,
            "numExecutorThreadPoolSize": 2,
            "numCacheExecutorThreadPoolSize": 1,
            "bookkeeperClientNumWorkerThreads": 2,
            "bookkeeperClientNumIoThreads": 2,
            "managedLedgerNumSchedulerThreads": 2,
            # The bookie: on the loopback interface and the port given (allowEphemeralPorts makes
            # PulsarStandalone take --bookkeeper-port instead of a port of its own choice), small caches.
            "allowEphemeralPorts": True,
            "listeningInterface": "lo",
            "allowLoopback": True,
            "httpServerEnabled": False,
            "serverNumIOThreads": 1,
            "numAddWorkerThreads": 1,
            "numReadWorkerThreads": 1,
            "numJournalCallbackThreads": 1,
            "dbStorage_writeCacheMaxSizeMb": 16,
            "dbStorage_readAheadCacheMaxSizeMb": 16,
            "dbStorage_rocksDB_blockCacheSize": 16 * 1024 * 1024,
        }
        if self.max_entries_per_ledger is not None:
            values["managedLedgerMaxEntriesPerLedger"] = self.max_entries_per_ledger
            values["managedLedgerMinLedgerRolloverTimeMinutes"] = 0
        values.update(self.overrides)
        return {key: _conf_value(value) for key, value in values.items()}

    def config_text(self) -> str:
        return "".join(f"{key}={value}\n" for key, value in self.config_values().items())

    def command(self) -> list[str]:
        """The ``java`` command line that runs this broker."""
        return [
            _java(),
            f"-Xmx{self.heap}",
            f"-XX:MaxDirectMemorySize={self.direct_memory}",
            *JVM_OPTIONS,
            *(QUICK_START_OPTIONS if self.quick_start else ()),
            f"-Dlog4j2.configurationFile={self.data_dir / LOG_CONFIG_NAME}",
            *self.jvm_options,
            "-cp",
            str(self.lib_dir / "*"),
            STARTER,
            "--config",
            str(self.config_path),
            "--no-functions-worker",
            "--no-stream-storage",
            "--bookkeeper-port",
            str(self.bookie_port),
            "--metadata-dir",
            str(self.data_dir / "metadata"),
            "--bookkeeper-dir",
            str(self.data_dir / "bookkeeper"),
        ]

    # --- the admin REST API ----------------------------------------------------------------

    def admin(self, method: str, path: str, body: Any = None, *, timeout: float = 60.0) -> Any:
        """Call the admin REST API (``/admin/v2/...``, what ``pulsar-admin`` calls) and return its JSON answer
        (None when empty). ``body`` is sent as JSON. An HTTP error raises :class:`BrokerError` with the
        broker's reason."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.admin_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            reason = exc.read().decode("utf-8", "replace")[:500]
            raise BrokerError(f"{method} {path} on {self.admin_url}: HTTP {exc.code} {reason}") from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    # --- lifecycle -------------------------------------------------------------------------

    def _may_pick_ports(self) -> bool:
        # Only before the first start: the bookie's port is then recorded in its cookie, which a restart honours.
        return not self._fixed_ports and not (self.data_dir / "metadata").exists()

    def _pick_ports(self) -> None:
        # Nothing was stored yet, but the metadata and the bookie's cookie name the taken ports: start afresh.
        shutil.rmtree(self.data_dir / "metadata", ignore_errors=True)
        shutil.rmtree(self.data_dir / "bookkeeper", ignore_errors=True)
        self.port, self.web_port, self.bookie_port = (free_port(self.host) for _ in range(3))

    def _spawn(self) -> subprocess.Popen[bytes]:
        self.config_path.write_text(self.config_text(), encoding="utf-8")
        (self.data_dir / LOG_CONFIG_NAME).write_text(_log_config(self.log_level), encoding="utf-8")
        with open(self.log_path, "ab") as log:
            log.write(
                f"\n--- streamoffload: starting Apache Pulsar {self.version} standalone on {self.service_url}, "
                f"admin {self.admin_url}, bookie {self.host}:{self.bookie_port} ---\n".encode()
            )
            log.flush()
            return subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(self.data_dir),
                env={**os.environ, **self.env} if self.env else None,
                start_new_session=True,
            )

    def _serving(self) -> bool:
        """``public/default`` exists, the binary port answers the Pulsar handshake and ``/admin/v2/brokers/health``
        (a produce and read on the broker's heartbeat topic) says ``ok``."""
        try:
            namespaces = self.admin("GET", "/admin/v2/namespaces/public", timeout=10.0)
            if not isinstance(namespaces, list) or "public/default" not in namespaces:
                return False
            if not pulsar_handshake(self.host, self.port, timeout=5.0):
                return False
            return bool(self.admin("GET", "/admin/v2/brokers/health", timeout=30.0) == "ok")
        except (BrokerError, OSError):
            return False

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.is_running else "stopped"
        return f"PulsarStandalone({self.version}, {self.service_url}, {self.admin_url}, {state})"


def _conf_value(value: str | int | float | bool) -> str:
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    if "\n" in text or "\r" in text:
        raise BrokerError(f"a standalone.conf value cannot span lines: {text!r}")
    return text


def _log_config(level: str) -> str:
    """log4j2: everything to stdout (the broker's log file) at ``level``; the per-request access log of the admin
    HTTP server only at WARN."""
    return "\n".join(
        [
            "status = error",
            "appender.out.type = Console",
            "appender.out.name = out",
            "appender.out.layout.type = PatternLayout",
            "appender.out.layout.pattern = %d{ISO8601} %-5level [%t] %c{1} - %msg%n",
            f"rootLogger.level = {level}",
            "rootLogger.appenderRef.out.ref = out",
            "logger.http.name = org.apache.pulsar.broker.web",
            "logger.http.level = warn",
            "logger.jetty.name = org.eclipse.jetty",
            "logger.jetty.level = warn",
            "",
        ]
    )
