"""Options shared by commands: a configuration file, or the essentials as flags so a first run needs
no file (``--service-url``, ``--topics``, ``--store URL``, ``--s3-endpoint``, ``--checkpoint``)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from streamoffload.codecs.positions import MAX_ID
from streamoffload.codecs.topics import TopicName
from streamoffload.config import Config, StoreSettings, check_topics_fit, check_trigger_interval, load_config
from streamoffload.errors import ConfigError, StreamOffloadError
from streamoffload.printable import printable
from streamoffload.pulsar.client_options import PULSAR_LOGGER
from streamoffload.redaction import PrivateFileHandler, RedactingFilter
from streamoffload.storage.location import parse_store_url

STORE_HELP = "object store as a URL: file:///abs/dir (or a plain directory) or s3://bucket/prefix"


def add_store_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration (a file, or flags that override it)")
    group.add_argument("--conf", metavar="FILE", help="TOML configuration file (see conf/streamoffload.toml)")
    group.add_argument("--store", metavar="URL", help=STORE_HELP)
    group.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint, e.g. http://127.0.0.1:9000")
    group.add_argument("--s3-region", metavar="REGION", help="S3 region (default: from the AWS chain)")


def add_job_args(parser: argparse.ArgumentParser) -> None:
    add_store_args(parser)
    group = parser.add_argument_group("job")
    group.add_argument("--service-url", metavar="URL", help="Pulsar service URL, e.g. pulsar://127.0.0.1:6650")
    group.add_argument("--topics", metavar="T1,T2", help="comma-separated topics (partitioned topics expand)")
    group.add_argument("--checkpoint", metavar="DIR", help="Spark checkpoint location")
    group.add_argument("--master", metavar="MASTER", help="Spark master (default local[2])")
    group.add_argument("--trigger-interval", metavar="INTERVAL", help="micro-batch interval, e.g. '5 seconds'")


def store_settings_from_url(url: str, endpoint: str | None = None, region: str | None = None) -> StoreSettings:
    """The store settings ``--store URL`` (with ``--s3-endpoint``/``--s3-region``) means. The URL goes through
    ``storage.location.parse_store_url``, so it is accepted or refused, with the same message, as everywhere."""
    location = parse_store_url(url, endpoint=endpoint, region=region)
    if location.scheme == "file":
        return StoreSettings(managedLedgerOffloadDriver="filesystem", root=str(Path(location.path).resolve()))
    return StoreSettings(
        managedLedgerOffloadDriver="aws-s3" if endpoint is None else "s3",
        bucket=location.bucket,
        prefix=location.prefix,
        serviceEndpoint=location.endpoint,
        region=location.region,
        pathStyle=location.path_style,
    )


def config_from_args(args: argparse.Namespace, *, need_file_or_store: bool = True) -> tuple[Config, str | None]:
    """The configuration the command runs with, and the file it came from (if any)."""
    path = getattr(args, "conf", None)
    config = load_config(path) if path else Config(source="<command line>")
    if getattr(args, "store", None):
        config = replace(config, store=store_settings_from_url(args.store, args.s3_endpoint, args.s3_region))
    elif need_file_or_store and not path:
        raise ConfigError("give --conf FILE or --store URL")
    pulsar = config.pulsar
    if getattr(args, "service_url", None):
        pulsar = replace(pulsar, service_url=args.service_url)
    if getattr(args, "topics", None):
        pulsar = replace(pulsar, topics=tuple(t.strip() for t in args.topics.split(",") if t.strip()))
    spark = config.spark
    if getattr(args, "checkpoint", None):
        spark = replace(spark, checkpoint=str(Path(args.checkpoint).resolve()))
    if getattr(args, "master", None):
        spark = replace(spark, master=args.master)
    if getattr(args, "trigger_interval", None):
        check_trigger_interval(args.trigger_interval, "--trigger-interval")
        spark = replace(spark, trigger_interval=args.trigger_interval)
    config = replace(config, pulsar=pulsar, spark=spark)
    check_topics_fit(config)  # --topics and --store (its prefix) may have changed what has to fit
    return config, path


# --- exit statuses: one meaning each, for every command (README "Exit statuses", `streamoffload --help`) ------

EXIT_OK = 0
"""Done: the command did what it was asked, and a check found nothing wrong."""
EXIT_FAILED = 1
"""An error (one line on stderr naming what was wrong and where), or a check that found problems (``verify``, the
demo's read-back, a failed ``offload-now`` request in ``offload-status --wait``)."""
EXIT_USAGE = 2
"""Bad usage: an unknown option, a missing argument, no command (argparse's own status)."""
EXIT_TIMEOUT = 3
"""``offload-status --wait --timeout``: gave up waiting with requests still pending."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (SIGINT): 128 + 2, as a shell reports it."""
EXIT_BROKEN_PIPE = 128 + 13
"""Standard output's reader went away (``... | head``): what a shell reports for a process killed by SIGPIPE."""

EXIT_STATUSES = (
    (EXIT_OK, "ok: done, and any check found nothing wrong"),
    (
        EXIT_FAILED,
        "failed: an error (one line on stderr), or a check found problems (`verify`, `demo`, "
        "a failed request in `offload-status --wait`)",
    ),
    (EXIT_USAGE, "bad usage: unknown option, missing argument, no command"),
    (EXIT_TIMEOUT, "`offload-status --wait --timeout`: requests still pending"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_BROKEN_PIPE, "standard output closed by its reader (`| head`)"),
)
"""Every exit status and its meaning, as README's table and ``--help`` list them."""


class CommandError(StreamOffloadError):
    """The root of the commands' errors: what a command was asked cannot be done as given (one line, exit 1)."""


class ArgumentError(CommandError):
    """A command-line value out of its range (printed as one line, exit status 1)."""


def int_arg(value: int | None, flag: str, low: int = 0, high: int = MAX_ID, what: str = "") -> int | None:
    """``value`` if it is ``None`` or in ``[low, high]``, else ``ArgumentError`` naming ``flag``."""
    if value is None or low <= value <= high:
        return value
    raise ArgumentError(f"{flag} {value}: {what or 'must be an integer'} in [{low}, {high}]")


def float_arg(value: float | None, flag: str, low: float, high: float, what: str = "") -> float | None:
    """``value`` if it is ``None`` or a finite number in ``[low, high]`` (never nan or inf)."""
    if value is None or (math.isfinite(value) and low <= value <= high):
        return value
    raise ArgumentError(f"{flag} {value:.15g}: {what or 'must be a finite number'} in [{low:.15g}, {high:.15g}]")


def topic_arg(text: str, config: Config) -> TopicName:
    """A topic-partition named on the command line, parsed; ``TopicNameError`` (one line) if the configured
    store could not hold it (non-persistent, or a name too long for its directory or keys), rather than a
    store error about a file name further on."""
    from streamoffload.storage.keys import check_topic_fits

    return check_topic_fits(config.store.location.prefix, text)


def ledger_id_arg(value: int | None, flag: str) -> int | None:
    """A ledger id: a Java long >= 0."""
    return int_arg(value, flag, 0, MAX_ID, "ledger ids are integers")


# --- logging: one place that decides where log lines go -------------------------------------------------

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class LogSettings:
    """Where log lines go. ``level``: the threshold of the Python loggers, pulsar-client's logger and Spark's
    log4j (``None``: WARNING, or INFO for Python's loggers in a log file; Spark stays at WARN unless a level is
    given). ``log_file``: every log line goes there, the terminal then shows errors only; without one, log lines
    at the level and above go to stderr. ``quiet``: the terminal shows errors only."""

    level: str | None = None
    quiet: bool = False
    log_file: str | None = None

    @property
    def python_level(self) -> int:
        if self.level is not None:
            return int(logging.getLevelName(self.level))
        return logging.INFO if self.log_file else logging.WARNING

    @property
    def spark_level(self) -> str:
        return {"WARNING": "WARN"}.get(self.level or "WARNING", self.level or "WARN")

    @property
    def terminal_level(self) -> int:
        if self.quiet or self.log_file:
            return logging.ERROR
        return self.python_level


class TerminalFormatter(logging.Formatter):
    """Log lines for the terminal: control characters in a message (a topic name read from the store, a broker's
    error text) are escaped (``printable``); the line breaks of a traceback stay."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep_newlines=True)


_current = LogSettings()


def log_settings() -> LogSettings:
    """The settings ``configure_logging`` applied last (the defaults before)."""
    return _current


def configure_logging(settings: LogSettings) -> LogSettings:
    """Apply ``settings`` to the Python root logger, pulsar-client's logger (``pulsar_logger``) and Spark (through
    ``streaming.job.session.configure_spark_logging``, used by the next ``build_session``). Idempotent: replaces the
    handlers it installed before. Every record they write is redacted (``redaction.RedactingFilter``: botocore's
    request headers at DEBUG, passwords in URLs, tokens), and a log file is created with mode 0600."""
    global _current
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_streamoffload", False):
            root.removeHandler(handler)
            handler.close()
    level = settings.python_level
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(settings.terminal_level)
    terminal.setFormatter(TerminalFormatter(LOG_FORMAT))
    terminal.addFilter(RedactingFilter())
    terminal._streamoffload = True  # type: ignore[attr-defined]
    if level > logging.DEBUG:
        # py4j logs the traceback of a failed foreachBatch at ERROR; the same failure ends the command with its
        # one-line error, so the terminal does not need the pages (a log file keeps them).
        terminal.addFilter(lambda record: not record.name.startswith("py4j"))
    root.addHandler(terminal)
    if settings.log_file:
        path = Path(settings.log_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            file_handler: logging.Handler = PrivateFileHandler(path, encoding="utf-8")  # mode 0600, redacted
        except OSError as err:
            raise ConfigError(f"--log-file {settings.log_file}: cannot write it: {err.strerror or err}") from None
        file_handler.setLevel(level)
        file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
        file_handler._streamoffload = True  # type: ignore[attr-defined]
        root.addHandler(file_handler)
        root.setLevel(level)
    else:
        root.setLevel(max(level, settings.terminal_level))
    # py4j logs every callback from the JVM at INFO: only with DEBUG asked for.
    logging.getLogger("py4j").setLevel(logging.DEBUG if level <= logging.DEBUG else max(level, logging.WARNING))
    # pulsar-client copies its logger's level into the C++ client when the client is created.
    logging.getLogger(PULSAR_LOGGER).setLevel(level)
    from streamoffload.streaming.job.session import configure_spark_logging

    configure_spark_logging(settings.spark_level, settings.log_file, quiet=settings.quiet)
    _current = settings
    return settings


def default_log_file(work_dir: str | Path, name: str = "streamoffload.log") -> Path:
    """Where a command that owns a work directory keeps its log: ``<work_dir>/logs/<name>``."""
    return Path(work_dir).resolve() / "logs" / name


# Set by a command that used pulsar-client in this process (see ``cli.entry``).
_skip_finalizers = False


def skip_finalizers_at_exit() -> None:
    """Have the process entry point end this process without interpreter finalization. pulsar-client's
    C++ destructors, run at interpreter shutdown, now and then abort a process that finished its work
    ("terminate called without an active exception", exit status -6) after its output was written."""
    global _skip_finalizers
    _skip_finalizers = True


def finalizers_skipped() -> bool:
    return _skip_finalizers
