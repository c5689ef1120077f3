"""``streamoffload broker``: run the embedded pulsar-lite broker in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from streamoffload.embedded_broker import EmbeddedBroker

EPILOG = """\
examples:
  streamoffload broker                          # free port, temporary data (removed on exit)
  streamoffload broker --port 6650 --data-dir var/broker
  streamoffload broker --partitions 4 --metrics-port 8081

Prints the service URL (pulsar://127.0.0.1:PORT) on stdout, then runs until Ctrl-C or SIGTERM.
Note: on pulsar-lite, partitioned topics work only through the base topic; to read partitions one by
one (as the offload job does), keep --partitions 0 and publish to TOPIC-partition-N topics."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded pulsar-lite broker in the foreground",
        description="Run the embedded Pulsar broker (pulsar-lite) on a loopback port until interrupted.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=None, help="listen port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--data-dir",
        default=None,
        help="data directory, kept across runs (default: a temporary directory removed on exit)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=0,
        help="default_partitions for auto-created topics (default: %(default)s)",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve pulsar-lite's Prometheus metrics on 127.0.0.1:PORT (default: off)",
    )
    parser.add_argument(
        "--broker-log-level",
        default="warn",
        choices=["error", "warn", "info", "debug", "trace"],
        help="pulsar-lite's log level; info logs every entry dispatched and acknowledged (default: %(default)s)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    broker = EmbeddedBroker(
        args.data_dir,
        port=args.port,
        default_partitions=args.partitions,
        metrics_port=args.metrics_port,
        log_level=args.broker_log_level,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        with broker:
            print(broker.service_url, flush=True)
            print(
                f"pulsar-lite pid {broker.pid}, data {broker.data_dir}, log {broker.log_path}; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            try:
                while not stop.wait(0.5):
                    if not broker.is_running:
                        print(f"pulsar-lite exited unexpectedly:\n{broker.log_tail()}", file=sys.stderr)
                        return 1
            except KeyboardInterrupt:
                pass
            print("stopping pulsar-lite", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
