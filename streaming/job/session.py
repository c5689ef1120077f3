"""Creating the Spark session the job and tests use, with the settings streaming offload needs.

Logging: the JVM (and the Python workers it starts, which print to its output) writes through a pipe
that this process drains (:func:`_pump`). With a log file (``configure_spark_logging``) every line goes
there; without one, the terminal gets Spark's WARN/ERROR records only, never the banner, Java stack
frames or the "TransformWithStateInPandas Python worker" chatter; errors reach the caller as Python
exceptions anyway. Spark's log4j level and configuration come from :func:`log4j_properties`, so there is
no "Setting default log level" banner either.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from streamoffload.redaction import MASK, private_opener, redact, register_secret, secret_name
from streamoffload.streaming import register
from streamoffload.streaming.job.class_archive import ClassArchive
from streamoffload.streaming.job.class_archive import class_archive as find_class_archive
from streamoffload.streaming.job.masters import Master, MasterKind, parse_master
from streamoffload.streaming.runtime.fork_client import SOCKET_ENV
from streamoffload.streaming.runtime.fork_server import ForkServer, start_fork_server
from streamoffload.streaming.runtime.worker_gc import freeze_long_lived
from streamoffload.streaming.runtime.worker_python import pyspark_from_directory, worker_python
from streamoffload.streaming.source.option_values import parse_size

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

SPARK_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")

NOISY_LOGGERS = (
    # One or more WARN lines per started query that say nothing an operator can act on.
    "org.apache.spark.sql.execution.streaming",
    "org.apache.spark.sql.execution.streaming.runtime",
    "org.apache.spark.sql.execution.streaming.state",
    "org.apache.spark.sql.catalyst.analysis.ResolveWriteToStream",
    "org.apache.spark.sql.execution.datasources.v2.python",
    "org.apache.spark.sql.execution.python",
    "org.apache.spark.api.python",
    "org.apache.spark.util.ShutdownHookManager",
    "org.apache.spark.SparkContext",
    "org.apache.spark.storage",
    "org.apache.spark.executor",
    "org.apache.spark.scheduler",
    "org.apache.spark.rpc",
    "org.apache.hadoop.util.NativeCodeLoader",
    "org.apache.hadoop.fs",
    "org.apache.spark.sql.internal.SharedState",
    "org.apache.spark.util.Utils",  # "Your hostname resolves to a loopback address", at every start
)
"""Quieted to ERROR on the terminal (a log file keeps them at the chosen level)."""


@dataclass(frozen=True)
class SparkLogging:
    level: str = "WARN"
    log_file: str | None = None
    quiet: bool = False


_logging = SparkLogging()


def configure_spark_logging(level: str = "WARN", log_file: str | None = None, *, quiet: bool = False) -> None:
    """Where the next :func:`build_session` sends Spark's output: ``log_file`` (everything), or the terminal
    (WARN/ERROR records only; nothing when ``quiet``). ``level`` is log4j's (WARNING is taken as WARN)."""
    global _logging
    level = {"WARNING": "WARN"}.get(level.upper(), level.upper())
    if level not in SPARK_LEVELS:
        raise ValueError(f"Spark log level {level!r}: expected one of {', '.join(SPARK_LEVELS)}")
    _logging = SparkLogging(level, log_file, quiet)


def spark_logging() -> SparkLogging:
    return _logging


def log4j_properties(settings: SparkLogging) -> str:
    """A log4j2 configuration: everything to the JVM's stderr (which :func:`_pump` reads) at ``settings.level``;
    the noisy loggers at ERROR unless a log file takes everything or a verbose level was asked for."""
    lines = [
        f"rootLogger.level = {settings.level.lower()}",
        "rootLogger.appenderRef.stderr.ref = console",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.pattern = %d{yyyy-MM-dd HH:mm:ss,SSS} %p %c: %m%n%ex",
    ]
    verbose = settings.level in ("ALL", "TRACE", "DEBUG", "INFO")
    if not verbose:
        for i, name in enumerate(NOISY_LOGGERS):
            lines += [f"logger.quiet{i}.name = {name}", f"logger.quiet{i}.level = error"]
    return "\n".join(lines) + "\n"


_RECORD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (WARN|ERROR|FATAL) ")


def terminal_line(line: str, settings: SparkLogging) -> bool:
    """Whether a line of the JVM's output is shown on the terminal when there is no log file: Spark's WARN and
    ERROR records (their first line), unless ``quiet``; everything at a verbose level; never the rest (banner,
    stack frames, Python workers' prints)."""
    if settings.level in ("ALL", "TRACE", "DEBUG", "INFO"):
        return True
    return not settings.quiet and _RECORD.match(line) is not None


def _pump(stream: IO[bytes], settings: SparkLogging) -> None:
    """Copy the JVM's output to the log file, or the lines :func:`terminal_line` admits to stderr, each line redacted
    (``redaction.redact``: Spark's configuration and its Python workers' lines may name credentials)."""
    out: IO[str] | None = None
    if settings.log_file:
        os.makedirs(os.path.dirname(os.path.abspath(settings.log_file)), exist_ok=True)
        # The file lives with the JVM (hence no "with"); mode 0600, as every log file of ours.
        out = open(settings.log_file, "a", encoding="utf-8", buffering=1, opener=private_opener)  # noqa: SIM115
    try:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace")
            try:
                if out is not None:
                    out.write(redact(line))
                elif terminal_line(line, settings):
                    clean = redact(line)
                    os.write(2, raw if clean == line else clean.encode())  # fd 2, where the JVM would have written it
            except (OSError, ValueError):  # stderr closed (a pipe's reader left): keep draining the JVM
                pass
    finally:
        if out is not None:
            out.close()


def _launch_gateway(conf: dict[str, str], settings: SparkLogging) -> None:
    """Start the JVM with its output piped to :func:`_pump` and a log4j2 configuration of ours, unless a
    gateway is already there (a session was built before, or spark-submit started this process)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if _gateway_up():
        return
    if os.environ.get("STREAMOFFLOAD_SPARK_OUTPUT") == "inherit":  # debugging: the JVM writes to our stdout/stderr
        return
    fd, path = tempfile.mkstemp(prefix="streamoffload-log4j2-", suffix=".properties")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(log4j_properties(settings))
    atexit.register(_remove_quietly, path)
    conf = dict(conf)
    option = f"-Dlog4j2.configurationFile=file:{path}"
    key = "spark.driver.extraJavaOptions"
    conf[key] = f"{conf[key]} {option}" if conf.get(key) else option
    popen: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    spark_conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))
    gateway = launch_gateway(spark_conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]  # pyspark's has no hints
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stdout is not None:
        threading.Thread(target=_pump, args=(proc.stdout, settings), name="spark-output", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)


def _gateway_up() -> bool:
    """Whether this process has its JVM already: a session was built before, or spark-submit started it."""
    from pyspark import SparkContext

    return "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None


class _Session(Protocol):
    def stop(self) -> None: ...


_archive: ClassArchive | None = None
"""The class archive of this process's JVM, from :func:`build_session` (None: none)."""

_CDS_OPTIONS = ("-XX:SharedArchiveFile", "-XX:ArchiveClassesAtExit", "-Xshare:off")


def _with_class_archive(conf: dict[str, str], setting: str) -> ClassArchive | None:
    """The driver JVM's option for its class archive, added to ``conf``; none where the user's Java options name
    one (or turn sharing off) themselves."""
    key = "spark.driver.extraJavaOptions"
    options = conf.get(key, "")
    if any(name in options for name in _CDS_OPTIONS):
        return None
    archive = find_class_archive(setting, conf, _spark_jars())
    if archive is not None:
        conf[key] = f"{options} {archive.java_option()}".strip()
    return archive


def _spark_jars() -> Path:
    """The jars of the Spark the driver JVM runs: ``$SPARK_HOME/jars``, else pyspark's own."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def stop_session(spark: _Session, on_write: Callable[[Path], None] | None = None) -> None:
    """Stop ``spark``. When its JVM writes a class archive (:func:`build_session`), also end the JVM and keep the
    archive, telling ``on_write`` its path first (the JVM takes seconds to write it). No Spark in this process
    after that."""
    global _archive
    spark.stop()
    archive, _archive = _archive, None
    if archive is None or archive.writing is None:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    if on_write is not None:
        on_write(archive.path)
    with contextlib.suppress(Exception):  # the gateway's connections; the JVM is ended through its stdin
        gateway.shutdown()  # type: ignore[union-attr]
    SparkContext._gateway = None
    SparkContext._jvm = None
    archive.finish(jvm)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


_fork_server: ForkServer | None = None


def _start_fork_server() -> None:
    """The fork server for Spark's one-off driver-side Python processes (``streaming/runtime/fork_server.py``), once
    per driver, before the JVM starts so that the JVM and its Python processes inherit its socket's name.
    ``STREAMOFFLOAD_FORK_SERVER=off`` leaves it out."""
    global _fork_server
    if _fork_server is not None or os.environ.get(SOCKET_ENV) == "off":
        return
    from pyspark import SparkContext

    if "PYSPARK_GATEWAY_PORT" in os.environ or SparkContext._gateway is not None:
        return  # the JVM is up already: it would not see the socket's name
    _fork_server = start_fork_server(log_path=_logging.log_file)
    if _fork_server is not None:
        os.environ[SOCKET_ENV] = _fork_server.path
        atexit.register(_fork_server.stop)


QUICK_JIT = "-XX:TieredStopAtLevel=1"
"""The JVM compiles hot code with C1 only. In the positions design the JVM carries no payload bytes; its
work is a fixed cost per micro-batch (planning, the state store, task scheduling), and with the default
tiered JIT the C2 compiler kept a core busy compiling it: 18.5 of the JVM's 34.8 CPU seconds over
``bench/offload.py``'s lag phase, and 4.5 of 7.8 in a 600 MB ``run --once``. With C1 only: 3.4 of 25.8
(and 45 micro-batches instead of 27 in the same minute), 0.8 of 3.3. Measured 2026-11-25, bench/README."""


G1_REGION = "-XX:G1HeapRegionSize=4m"
"""The local JVM's G1 heap regions: 4 MB, so that the buffers Spark allocates for every micro-batch stay below
half a region and are ordinary young objects. With the default 1 MB regions (a 2g heap), a broadcast's 4 MB
chunk, a task result's and a collect's 1 MB chunk, and a sort's 16 MB page were each "humongous": allocated
straight into the old generation as a contiguous run of free regions, ~26 MB/s of them at 2,000 msg/s, each
starting a collection of its own, and finding runs of free regions made G1 grow the heap by hundreds of MB
between collections. The hour's soak saw the JVM's RSS step from ~860 to ~990 MiB and spike to 1,363 MiB while
the live old generation stayed at 163 MiB (``-XX:NativeMemoryTracking`` and a JFR recording of allocations
outside TLABs, 2026-11-28, bench/README)."""
SMALL_BUFFERS = {
    "spark.buffer.pageSize": "1m",
    "spark.broadcast.blockSize": "1m",
}
"""Spark's buffers sized below half of :data:`G1_REGION` (see there). ``spark.buffer.pageSize``: the pages sorts and
shuffle writers take (derived from the heap: 16 MB with 2g on 2 cores; a bigger sort takes more pages, a task can
hold 8,192, beyond its share of execution memory). ``spark.broadcast.blockSize``: the chunks a broadcast is
serialized into (4 MB; locally the blocks never cross a network)."""


YOUNG_GEN = "-Xmn128m"
"""The local JVM's young generation, fixed at 128 MB (eden is ~0.9 s of a 2,000 msg/s job's allocations; a
young collection takes ~10 ms). G1 otherwise sizes eden as a share of the committed heap, and grows the heap
when collections take more than ~8% of the time for a while (a busy machine): the pages of a larger eden are
touched within a second and stay resident until a full collection shrinks the heap. An hour's soak with only
:data:`G1_REGION` saw eden go from ~26 to 45 regions at 16 minutes and the JVM's RSS from ~700 to ~800 MiB. With
eden fixed, a grown heap holds free regions nobody touches."""

HEAP_FLOOR = "-Xms384m"
"""The local JVM's committed heap never below 384 MB: the young generation's 128 MB and room for the old one
(live ~100 MiB after a full collection at 2,000 msg/s over 100 topic-partitions, ~160 MiB at 1,000). With a
fixed eden G1 still grew the committed heap under load, and the old generation's regions come from the top
of the free list, so each growth was touched and stayed resident: the hour's soak of 2026-11-28 saw one
young collection take the heap from 256 to 308 MB at 36 minutes and the RSS step by 63 MiB with it."""

PRE_TOUCH = "-XX:+AlwaysPreTouch"
"""The heap's floor (:data:`HEAP_FLOOR`) made resident at start-up (~0.1 s for 384 MB), so the JVM's RSS is
what it will be from the first minute instead of creeping up as the old generation first reaches each
region: an operator sizes a container by what they see at start."""

GC_TIME_GOAL = "-XX:GCTimeRatio=4"
"""G1 grows the heap on its own only when collections take more than ~20% of the time (``1/(1+4)``), not
G1's default ~8% (12). G1 scales that goal down with the committed heap (by 384 MB / 1 GB at the floor of a 2g
heap: 2.9% by default) and compares it with each young pause against the time since the previous collection
ended, so on a CPU-starved machine a few pauses stretched to 0.1-0.7 s by the scheduler, not by work, were
enough: the hour's soak of 2026-11-28 saw six such growths of 68 MB (the smallest step with a 2g heap) and one
of 304 MB, each touched at once (:data:`PRE_TOUCH`) and held until a full collection. Replaying that hour's
pauses through G1's sizing rule grows the heap five times at the default and never at 4. The heap still grows
when the old generation needs room (a full collection keeps 40% free, ``MinHeapFreeRatio``); the job's
collections take ~1% of the time."""

LOCAL_JVM_OPTIONS = (
    (("TieredStopAtLevel", "TieredCompilation"), QUICK_JIT),
    (("G1HeapRegionSize",), G1_REGION),
    (("Xmn", "NewSize"), YOUNG_GEN),
    (("Xms", "InitialHeapSize"), HEAP_FLOOR),
    (("AlwaysPreTouch",), PRE_TOUCH),
    (("GCTimeRatio",), GC_TIME_GOAL),
)
"""The local JVM's options, each left out when the user's own options name any of its flags."""


JVM_ENVIRONMENT = {"MALLOC_ARENA_MAX": "2"}
"""The local JVM's environment (and so its Python workers'), each variable unless already set. glibc gives
each thread that contends for its allocator an arena of its own, up to 8 per core, and freed memory stays in
them: RocksDB's and Netty's threads allocate outside the heap, and what the JVM does not account for itself
(RSS minus native memory tracking's total) crept from 78 to 97 MiB over the hour's soak. Hadoop's YARN caps
its containers' arenas the same way."""

HEAP_FLOOR_OPTIONS = (HEAP_FLOOR, PRE_TOUCH)
"""Left out where the heap is smaller than the floor (``spark.driver.memory`` below 384m): the JVM would not
start with an initial heap above its maximum."""


def heap_bytes(memory: str) -> int:
    """``spark.driver.memory`` in bytes: a number is MiB, as Spark reads it (``2048``, ``2g``, ``512m``)."""
    text = memory.strip()
    return parse_size(text + "m" if text.isdigit() else text, "spark.driver.memory")


def driver_java_options(user: str, memory: str = "2g") -> str:
    """The local JVM's options: :data:`LOCAL_JVM_OPTIONS` (:data:`QUICK_JIT`, :data:`G1_REGION`,
    :data:`YOUNG_GEN`, :data:`HEAP_FLOOR`, :data:`PRE_TOUCH`, :data:`GC_TIME_GOAL`) before the user's, except those
    whose flags the user set themselves, and the heap's floor where the heap (``memory``) is smaller than it."""
    small = heap_bytes(memory) < parse_size(HEAP_FLOOR.removeprefix("-Xms"), "HEAP_FLOOR")
    ours = [
        option
        for flags, option in LOCAL_JVM_OPTIONS
        if not any(flag in user for flag in flags) and not (small and option in HEAP_FLOOR_OPTIONS)
    ]
    return " ".join([*ours, user]).strip()


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


@dataclass(frozen=True)
class SessionPlan:
    """What :func:`build_session` does for one master (:func:`session_plan`; a pure function, tested per master)."""

    master: Master
    conf: dict[str, str]
    """The settings handed to the session builder: the job's, under what the user set (they win)."""
    submitted: bool
    """Under spark-submit: the JVM is up with the user's master and resources."""
    shuffle_from_parallelism: bool
    """Neither the user nor the master string says how many cores the tasks get: ``spark.sql.shuffle.partitions``
    is set to Spark's ``defaultParallelism`` once the context is up (the executors' cores registered by then)."""

    @property
    def worker_tricks(self) -> bool:
        """The launcher without Spark's zips (``runtime/worker_python.py``), the driver's fork server
        (``runtime/fork_server.py``) and the pre-importing worker daemon (``runtime/worker_daemon.py``): where every
        Python worker runs on this machine with this interpreter, and this process starts the JVM."""
        return self.master.on_this_machine and not self.submitted


def executor_cores(conf: Mapping[str, str]) -> int | None:
    """The cores the executors give the job's tasks by the configuration: ``spark.executor.instances`` x
    ``spark.executor.cores``, else ``spark.cores.max`` (standalone's cap on the application's cores); None when
    neither says (dynamic allocation, or a standalone application taking what the workers have)."""
    try:
        instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
        if instances and cores and not _true(conf.get("spark.dynamicAllocation.enabled", "false")):
            return max(1, int(instances) * int(cores))
        if conf.get("spark.cores.max"):
            return max(1, int(conf["spark.cores.max"]))
    except ValueError:
        return None  # Spark refuses the value itself, naming it
    return None


def _true(text: str) -> bool:
    return text.strip().lower() == "true"


def session_plan(
    master: str,
    *,
    app_name: str = "streamoffload",
    work_dir: str | None = None,
    user: Mapping[str, str] | None = None,
    submitted: Mapping[str, str] | None = None,
) -> SessionPlan:
    """The settings of a session on ``master`` (``[spark] master``; under spark-submit, ``submitted``, the JVM's
    configuration, says the master instead). ``user``: ``[spark.conf]`` with ``--spark-conf`` over it. Every
    setting of the job gives way to one the user made (``user`` or spark-submit's ``--conf``); README "Running on a
    cluster" has the table.

    On every master: the RocksDB state store (transformWithState needs it), Arrow for pandas conversions, no console
    progress bar. ``spark.sql.shuffle.partitions`` (the segmenter's tasks and state stores: one key per
    topic-partition, so Spark's 200 mostly run empty tasks) is the cores the tasks get: ``local[n]``'s n,
    ``local-cluster[N,C,M]``'s N x C, a cluster's :func:`executor_cores`, else ``defaultParallelism`` once up. Each
    run's checkpoint is fresh (``queries.STATE_STORE_CONF``), so a restart with more executors uses them.

    Only on ``local`` masters: no Spark UI (one JVM on one machine, watched through the job's own metrics; the UI
    keeps every job's and stage's history in the driver's heap), the JVM's options and environment measured on it
    (:data:`LOCAL_JVM_OPTIONS`, :data:`SMALL_BUFFERS`, :data:`JVM_ENVIRONMENT`, for a heap that holds the tasks'
    work too). Only where every worker is on this machine (``local``, ``local-cluster``): the worker tricks
    (:attr:`SessionPlan.worker_tricks`) and ``spark.local.dir`` under ``work_dir``. Under spark-submit the JVM is
    already up: no ``spark.master``, ``spark.driver.memory`` or JVM options (spark-submit's own options say them).
    """
    given = {**(submitted or {}), **(user or {})}
    effective = (submitted or {}).get("spark.master") or (user or {}).get("spark.master") or master
    parsed = parse_master(effective)
    local = parsed.kind is MasterKind.LOCAL
    ours: dict[str, str] = {
        "spark.app.name": app_name,
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    cores = parsed.cores if parsed.cores is not None else executor_cores(given)
    if cores is not None:
        ours[SHUFFLE_PARTITIONS] = str(cores)
    if local:
        ours["spark.ui.enabled"] = "false"
        ours.update(SMALL_BUFFERS)
    if submitted is None:
        ours["spark.master"] = master
        ours["spark.driver.memory"] = "2g"
    if work_dir:
        ours["spark.sql.warehouse.dir"] = os.path.join(work_dir, "warehouse")
        if parsed.on_this_machine:
            ours["spark.local.dir"] = os.path.join(work_dir, "local")
    # What the user set stays: under spark-submit it is in the JVM already (its --name, --conf), else it goes in.
    conf = {key: value for key, value in ours.items() if key not in given}
    conf.update(user or {})
    plan = SessionPlan(parsed, conf, submitted is not None, cores is None and SHUFFLE_PARTITIONS not in given)
    if local and submitted is None:
        conf["spark.driver.extraJavaOptions"] = driver_java_options(
            conf.get("spark.driver.extraJavaOptions", ""), conf["spark.driver.memory"]
        )
    if plan.worker_tricks:
        # Workers forked with pandas, pyarrow and the job's modules already imported
        # (streaming/runtime/worker_daemon.py). Not on a cluster: the daemon starts before a task's --py-files are
        # on the path, so a cluster that ships streamoffload that way could not import it.
        conf.setdefault("spark.python.daemon.module", "streamoffload.streaming.runtime.worker_daemon")
    return plan


def shown_settings(conf: Mapping[str, str]) -> str:
    """``conf`` as one line for a log, sorted, the value of every secret-named setting masked whole."""
    return ", ".join(
        f"{key}={MASK}" if secret_name(key) else redact(f"{key}={value}") for key, value in sorted(conf.items())
    )


def submitted_conf() -> dict[str, str] | None:
    """Under spark-submit (the JVM started this process), the configuration it was given (``--master``, ``--conf``,
    ``spark-defaults.conf``); None otherwise."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf(loadDefaults=True).getAll())


def _skip_python_source_lookup(session: SparkSession) -> None:
    """Spare Spark its lookup of Python data sources installed as ``pyspark_*`` packages: the first data source
    registration in a JVM starts a Python worker that walks every module on ``sys.path`` for them (0.8-1.1 s of
    every run here). The sessions built here use only streamoffload's sources, registered by name. Spark keeps the
    lookup's result for the whole JVM (``DataSourceManager.dataSourceBuilders``): it is set to none found unless
    a lookup already ran. A Spark without that member keeps its lookup."""
    jvm = session.sparkContext._jvm
    if jvm is None:
        return
    try:
        manager = getattr(getattr(jvm.org.apache.spark.sql.execution.datasources, "DataSourceManager$"), "MODULE$")
        if manager.dataSourceBuilders().isEmpty():
            getattr(manager, "dataSourceBuilders_$eq")(jvm.scala.Some(jvm.scala.Predef.Map().empty()))
    except Exception:  # another Spark than 4.x: its lookup runs as it would
        log.debug("Spark's lookup of pyspark_* data sources left as it is", exc_info=True)


def build_session(
    master: str = "local[2]",
    app_name: str = "streamoffload",
    work_dir: str | None = None,
    extra_conf: Mapping[str, str] | None = None,
    class_archive: str = "",
) -> Any:
    """A SparkSession with the settings of :func:`session_plan` for ``master`` and streamoffload's Python data
    sources registered (``streaming.register``), but none of Spark's ``pyspark_*`` ones
    (:func:`_skip_python_source_lookup`). ``extra_conf``: the user's settings (they win).
    ``class_archive``: where the driver JVM's classes are kept between runs (``[spark] classArchive``;
    ``streaming.job.class_archive``; end the session with :func:`stop_session` so a new archive is kept)."""
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    plan = session_plan(master, app_name=app_name, work_dir=work_dir, user=extra_conf, submitted=submitted_conf())
    workers = os.environ.get("PYSPARK_PYTHON") or sys.executable
    if plan.worker_tricks and workers == sys.executable and pyspark_from_directory():
        # This interpreter's pyspark, from site-packages: no recompiling it from the zip in every process.
        workers = worker_python(python=workers)
        _start_fork_server()
    os.environ["PYSPARK_PYTHON"] = workers
    if plan.master.single_jvm and not plan.submitted:
        for name, value in JVM_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    from pyspark.sql import SparkSession

    conf = dict(plan.conf)
    global _archive
    _archive = _with_class_archive(conf, class_archive) if class_archive and not _gateway_up() else None
    # Spark's own log prints its configuration at INFO, and errors may quote a value: secret-named ones masked.
    register_secret(*(value for key, value in conf.items() if secret_name(key)))
    log.info("Spark on %s: %s", plan.master.url, shown_settings(conf))
    settings = _logging
    _launch_gateway(conf, settings)
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(settings.level)
    if plan.shuffle_from_parallelism:
        session.conf.set(SHUFFLE_PARTITIONS, str(max(1, int(session.sparkContext.defaultParallelism))))
    _skip_python_source_lookup(session)
    register(session)
    freeze_long_lived()  # the driver's too: a gen-2 collection of its ~140,000 objects paused every thread 40-50 ms
    return session
