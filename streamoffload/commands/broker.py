"""``streamoffload broker``: run the embedded pulsar-lite broker (or, with ``--pulsar``, Apache Pulsar
standalone) in the foreground."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from types import FrameType

from streamoffload.embedded_broker import BrokerError, EmbeddedBroker
from streamoffload.pulsar_standalone import PULSAR_VERSION, PulsarStandalone

EPILOG = """\
examples:
  streamoffload broker                          # free port, temporary data (removed on exit)
  streamoffload broker --port 6650 --data-dir var/broker
  streamoffload broker --partitions 4 --metrics-port 8081
  streamoffload broker --pulsar                 # Apache Pulsar standalone (bash scripts/pulsar.sh fetch first)

Prints the service URL (pulsar://127.0.0.1:PORT) on stdout, then runs until Ctrl-C or SIGTERM.
Note: on pulsar-lite, partitioned topics work only through the base topic; to read partitions one by
one (as the offload job does), keep --partitions 0 and publish to TOPIC-partition-N topics.
With --pulsar: Apache Pulsar standalone (one JVM: broker, bookie, RocksDB metadata; no functions worker),
from the jars `bash scripts/pulsar.sh fetch` resolves from Maven Central; it also prints its admin URL
(what pulsar-admin's --admin-url takes). It takes tens of seconds to start."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "broker",
        help="run the embedded pulsar-lite broker in the foreground",
        description="Run the embedded Pulsar broker (pulsar-lite) on a loopback port until interrupted.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--pulsar",
        action="store_true",
        help=f"run Apache Pulsar {PULSAR_VERSION} standalone instead of pulsar-lite",
    )
    parser.add_argument("--port", type=int, default=None, help="listen port on 127.0.0.1 (default: a free one)")
    parser.add_argument(
        "--web-port",
        type=int,
        default=None,
        help="with --pulsar: the admin HTTP port on 127.0.0.1 (default: a free one)",
    )
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
    broker: EmbeddedBroker | PulsarStandalone
    if args.pulsar:
        if args.partitions or args.metrics_port is not None:
            raise BrokerError(
                "--partitions and --metrics-port are pulsar-lite's; Apache Pulsar creates partitioned topics "
                "through its admin API and serves metrics on its admin port (/metrics)"
            )
        broker = PulsarStandalone(args.data_dir, port=args.port, web_port=args.web_port, log_level="info")
        name = "Apache Pulsar"
    else:
        if args.web_port is not None:
            raise BrokerError("--web-port is Apache Pulsar's (with --pulsar); pulsar-lite has no admin HTTP port")
        broker = EmbeddedBroker(
            args.data_dir,
            port=args.port,
            default_partitions=args.partitions,
            metrics_port=args.metrics_port,
            log_level=args.broker_log_level,
        )
        name = "pulsar-lite"
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        with broker:
            print(broker.service_url, flush=True)
            if isinstance(broker, PulsarStandalone):
                print(broker.admin_url, flush=True)
            print(
                f"{name} pid {broker.pid}, data {broker.data_dir}, log {broker.log_path}; Ctrl-C to stop",
                file=sys.stderr,
                flush=True,
            )
            try:
                while not stop.wait(0.5):
                    if not broker.is_running:
                        print(f"{name} exited unexpectedly:\n{broker.log_tail()}", file=sys.stderr)
                        return 1
            except KeyboardInterrupt:
                pass
            print(f"stopping {name}", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
