"""What the benches that drive a job share: on their command line the store to use, where the work directory
goes and whether to keep it, and unwinding cleanly on SIGTERM (bench/soak.py; bench/chaos.py does the same
inline); the ``[store]`` table of the job's configuration, and a local moto_server with a bucket for it
(bench/offload.py, bench/chaos.py, bench/soak.py); and the broker a bench runs against, pulsar-lite or Apache
Pulsar standalone (``--broker``: bench/offload.py, bench/source.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.s3_endpoint import moto_endpoint, raw_s3_client
from streamoffload.embedded_broker import EmbeddedBroker
from streamoffload.pulsar_standalone import PulsarStandalone

BROKERS = ("pulsar-lite", "pulsar")
Broker = EmbeddedBroker | PulsarStandalone


def add_work_arguments(parser: argparse.ArgumentParser) -> None:
    """``--store fs|s3``, ``--work-dir DIR`` and ``--keep``."""
    parser.add_argument("--store", choices=["fs", "s3"], default="fs", help="filesystem, or S3 on a local moto_server")
    parser.add_argument("--work-dir", help="parent of the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (job logs under logs/)")


def new_work_dir(parent: str | None, prefix: str) -> Path:
    """A fresh temporary work directory (under ``parent`` when given). From now on SIGTERM unwinds through the
    caller's ``finally`` blocks, which stop the job, the producer and the broker."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    if parent:
        os.makedirs(parent, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


# --- the broker a bench runs against ------------------------------------------------------------------------


def add_broker_argument(parser: argparse.ArgumentParser) -> None:
    """``--broker pulsar-lite|pulsar``."""
    parser.add_argument(
        "--broker",
        choices=BROKERS,
        default="pulsar-lite",
        help="the embedded pulsar-lite (default), or Apache Pulsar standalone (bash scripts/pulsar.sh fetch first)",
    )


def bench_broker(kind: str, data_dir: Path) -> Broker:
    """A broker of ``kind`` (not started; use it as a context manager). Apache Pulsar runs with its full JIT
    (``quick_start=False``): benches measure its dispatch, not its start-up."""
    if kind == "pulsar":
        return PulsarStandalone(data_dir, quick_start=False, log_level="warn")
    return EmbeddedBroker(data_dir)


def broker_name(broker: Broker) -> str:
    """How a bench prints its broker: ``pulsar-lite``, or ``Apache Pulsar <version> (started in N s)``."""
    if isinstance(broker, PulsarStandalone):
        return f"Apache Pulsar {broker.version} standalone (started in {broker.started_in_s or 0:.0f} s)"
    return "pulsar-lite"


# --- the store a bench's job writes to ----------------------------------------------------------------------


def fs_store_section(root: Path) -> dict[str, Any]:
    """The ``[store]`` table of a filesystem store at ``root``."""
    return {"managedLedgerOffloadDriver": "filesystem", "root": str(root)}


def s3_store_section(endpoint: str, bucket: str, prefix: str) -> dict[str, Any]:
    """The ``[store]`` table of ``bucket``/``prefix`` on a local S3 endpoint (moto, or the fault proxy)."""
    return {
        "managedLedgerOffloadDriver": "s3",
        "bucket": bucket,
        "prefix": prefix,
        "serviceEndpoint": endpoint,
        "region": "us-east-1",
        "pathStyle": True,
    }


def store_toml(section: dict[str, Any]) -> str:
    """``section`` as the ``[store]`` table of a TOML configuration file."""
    values = {k: ("true" if v else "false") if isinstance(v, bool) else json.dumps(v) for k, v in section.items()}
    return "[store]\n" + "\n".join(f"{key} = {value}" for key, value in values.items())


def moto_credentials(env: dict[str, str] | None = None) -> None:
    """moto takes any credentials: set them in this process's environment (before Spark starts, so that its
    Python processes inherit them) and in ``env``, a job process's environment."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "testing")
        if env is not None:
            env.setdefault(key, "testing")


@contextlib.contextmanager
def moto_bucket(log_path: Path, bucket: str) -> Iterator[str]:
    """A local moto_server on a free port with ``bucket`` created; yields its URL."""
    with moto_endpoint(log_path) as url:
        raw_s3_client(url).create_bucket(Bucket=bucket)
        yield url
