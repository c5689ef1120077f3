"""The ``streamoffload`` command line. Subcommands live in ``streamoffload.commands``."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import select
import sys
from collections.abc import Sequence

from streamoffload import __version__, commands
from streamoffload.codecs.errors import StreamOffloadError

DESCRIPTION = """\
Continuously offload Apache Pulsar topics into object storage in the PIP-76 streaming offload
format, read them back by position, and watch the job on a dashboard.

Run `streamoffload COMMAND --help` for the options of one command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streamoffload",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging verbosity on stderr (default: %(default)s)",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
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
        print(f"streamoffload {args.command}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"streamoffload {args.command}: interrupted", file=sys.stderr)
        return 130


EXIT_BROKEN_PIPE = 128 + 13
"""Exit status when standard output's reader has gone: what a shell reports for a process killed by SIGPIPE."""


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
