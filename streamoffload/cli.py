"""The ``streamoffload`` command line. Subcommands live in ``streamoffload.commands``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import pkgutil
import re
import select
import sys
from collections.abc import Sequence
from typing import NoReturn

from streamoffload import __version__, commands
from streamoffload.cli_common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_STATUSES,
    EXIT_USAGE,
    LOG_LEVELS,
    LogSettings,
    configure_logging,
    finalizers_skipped,
    log_settings,
)
from streamoffload.errors import StreamOffloadError
from streamoffload.printable import printable
from streamoffload.redaction import redact

DESCRIPTION = """\
Continuously offload Apache Pulsar topics into object storage in the PIP-76 streaming offload
format, read them back by position, and watch the job on a dashboard.

Run `streamoffload COMMAND --help` for the options of one command."""

EPILOG = """\
examples:
  streamoffload demo                                   # the whole pipeline on the embedded default
  streamoffload run --conf conf/streamoffload.toml     # the continuously running job
  streamoffload status --store var/demo/store
  streamoffload completion bash > ~/.local/share/bash-completion/completions/streamoffload

exit statuses (every command):
""" + "\n".join(f"  {code:<4} {text.replace('`', '')}" for code, text in EXIT_STATUSES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamoffload",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_logging_args(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    parser.set_defaults(top_parser=parser)  # for `completion`, which describes the whole command line
    return parser


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """The logging options. They are accepted anywhere on the command line (``split_logging_args`` takes
    them out before the subcommand's parser sees the rest); they are declared here for ``--help``."""
    group = parser.add_argument_group("logging (anywhere on the command line)")
    group.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        help="threshold of the Python loggers, pulsar-client and Spark's log4j (default: WARNING; INFO into a "
        "--log-file)",
    )
    group.add_argument("-q", "--quiet", action="store_true", help="errors only on the terminal")
    group.add_argument("--log-file", metavar="FILE", help="write every log line here (the terminal shows errors)")


def split_logging_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(logging options, the rest)``: ``--log-level L``/``--log-level=L``, ``--log-file F``/``--log-file=F``
    and ``-q``/``--quiet`` wherever they are (before the subcommand or after it), up to a ``--``."""
    taken: list[str] = []
    rest: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        if item == "--":
            rest.extend(items[i:])
            break
        if item in ("-q", "--quiet"):
            taken.append(item)
        elif item in ("--log-level", "--log-file"):
            taken.extend(items[i : i + 2])
            i += 1
        elif item.startswith(("--log-level=", "--log-file=")):
            taken.append(item)
        else:
            rest.append(item)
        i += 1
    return taken, rest


def entry() -> NoReturn:
    """The process entry point (the ``streamoffload`` script, ``python -m streamoffload``): ``main``, then
    exit. After a command that used pulsar-client, the process ends without interpreter finalization,
    once output and logs are flushed (``cli_common.skip_finalizers_at_exit``)."""
    code = main()
    if finalizers_skipped():
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    logging_argv, rest = split_logging_args(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(rest)
    parser.parse_args(logging_argv, namespace=args)
    command = getattr(args, "command", None) or "streamoffload"
    try:
        configure_logging(LogSettings(args.log_level, args.quiet, args.log_file))
    except StreamOffloadError as err:
        print(f"streamoffload {command}: error: {shown(str(err))}", file=sys.stderr)
        return EXIT_FAILED
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, not at interpreter exit, so that a closed pipe is seen below
        return code
    except BrokenPipeError:
        if not _stdout_is_broken():
            raise  # a socket's broken pipe (a store, the broker): a real error, not our reader leaving
        # The reader of our output went away (`... | head`): stop quietly, as other command-line tools do.
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except StreamOffloadError as err:
        message = one_line(err)
        hint = ""
        if message != str(err).strip():  # shortened: the whole text goes to the log file, if there is one
            _log_details(f"{args.command} failed: {err}")
            hint = _log_hint()
        print(f"streamoffload {args.command}: error: {shown(message)}{hint}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(f"streamoffload {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        if not is_spark_error(err):
            raise
        # A failed Spark query or call: pages of Java and Python frames, of which one line says what happened.
        _log_details(f"{args.command} failed", err)
        print(f"streamoffload {args.command}: error: {shown(root_cause(err))}{_log_hint()}", file=sys.stderr)
        return EXIT_FAILED


def shown(message: str) -> str:
    """An error line as the terminal gets it: secrets masked (``redaction.redact``; the message should carry
    none, this is the last guard) and control characters escaped (``printable``: names read from a store or a
    file may hold an ESC or a line break)."""
    return printable(redact(message))


def is_spark_error(err: BaseException) -> bool:
    """Whether ``err`` comes from Spark or Py4J (a ``StreamingQueryException``, a ``Py4JJavaError``, ...)."""
    module = type(err).__module__ or ""
    return module.startswith(("pyspark", "py4j"))


_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)): (?P<message>\S.*)$")
_JAVA_CAUSE = re.compile(r"^Caused by: (?P<name>[\w.$]+): (?P<message>.+)$")


def root_cause(err: BaseException | str) -> str:
    """One line naming the cause of a Spark/Py4J failure: the exception that ended the innermost Python
    traceback in the text (what a Python data source or UDF raised), else the last Java ``Caused by:``,
    else the first line. The class is shown by its short name (``EntryTooLargeError: entry 2:1 ...``)."""
    text = err if isinstance(err, str) else _error_text(err)
    lines = text.splitlines()
    last_tb = max((i for i, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK)), default=None)
    if last_tb is not None:
        for line in lines[last_tb + 1 :]:
            match = _EXCEPTION_LINE.match(line.strip()) if not line.startswith((" ", "\t")) else None
            if match:
                return f"{match['name'].rsplit('.', 1)[-1]}: {match['message'].strip()}"
    causes = [m for m in (_JAVA_CAUSE.match(line.strip()) for line in lines) if m]
    if causes:
        return f"{causes[-1]['name'].rsplit('.', 1)[-1]}: {causes[-1]['message'].strip()}"
    fallback = "" if isinstance(err, str) else type(err).__name__
    return next((line.strip() for line in lines if line.strip()), fallback)


def one_line(err: BaseException) -> str:
    """The message of a ``StreamOffloadError`` as one line: a message that carries a Spark failure's text
    (``offload query failed: <pages>``) keeps its first words and the root cause."""
    text = str(err)
    if "\n" not in text.strip():
        return text.strip()
    head = text.split(":", 1)[0].strip()
    return f"{head}: {root_cause(text)}"


def _error_text(err: BaseException) -> str:
    """The whole text of a Spark/Py4J error, without asking the JVM when the message is already in Python (a
    ``CapturedException``'s ``str()`` needs the JVM, which may be gone)."""
    parts: list[str] = []
    for attr in ("_desc", "desc", "_stackTrace", "stackTrace"):
        value = getattr(err, attr, None)
        if isinstance(value, str) and value and value not in parts:
            parts.append(value)
    if not parts:
        try:
            parts.append(str(err))
        except Exception:
            parts.append(type(err).__name__)
    return "\n".join(parts)


def _log_details(message: str, err: BaseException | None = None) -> None:
    """Write the full text of an error to the log file (never to the terminal, which gets the one line)."""
    if not log_settings().log_file:
        return
    text = message
    if err is not None:
        import traceback

        where = "".join(traceback.format_tb(err.__traceback__))
        text = f"{message}: {type(err).__name__}\n{_error_text(err)}\nPython traceback:\n{where}"
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(logging.LogRecord("streamoffload", logging.ERROR, __file__, 0, text, None, None))


def _log_hint() -> str:
    settings = log_settings()
    return f" (details in {settings.log_file})" if settings.log_file else ""


def _stdout_is_broken() -> bool:
    """Whether standard output is a pipe (or socket) nobody reads any more."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _silence_stdout() -> None:
    """Point standard output at /dev/null so the interpreter's final flush of what is still buffered does
    not fail again (and print "Exception ignored ... BrokenPipeError")."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
